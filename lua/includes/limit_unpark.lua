-- include: group_requeue
-- include: now_ms
-- Limits (dtq/limits.py). A running task with a limit key k holds a place in the zset
-- <lim_base>k:run (tid -> attempt); tasks parked behind k's concurrency limit wait in the list
-- <lim_base>k:held with status "queued" and no entry. Two sets of limit keys sit beside them
-- (no limit key makes these names: every key of a limit ends in :run, :held, :rate or :rwait):
-- <lim_base>~parked lists the keys whose held list may be non-empty (purge.lua reads it) and
-- <lim_base>~owed the keys whose release ran out of budget (limit_sweep.lua finishes it).
--
-- limit_unpark puts up to n parked tasks of key lk back into their priority streams (n nil: as
-- many as the limit has room for: lc of the first live one minus the runs holding a place),
-- looking at no more than budget parked ids. Dead ids (cancelled, purged, record gone) are
-- dropped; a task whose expiry passed while parked goes back too, for the claim to end it
-- "expired", without counting. A released live task is owed the place it was released for
-- (field lown, until its run starts or it is parked again: see limit_pass_on). Returns
-- released, more (1 when the budget ran out before n were released and ids are left) and the
-- number of ids looked at.
local function limit_unpark(lim_base, lk, base, streams, n, budget)
  local held = lim_base .. lk .. ':held'
  local released, looked, now = 0, 0, nil
  while n == nil or released < n do
    if looked >= budget then
      if redis.call('EXISTS', held) == 1 then return released, 1, looked end
      break
    end
    local ptid = redis.call('LPOP', held)
    if not ptid then
      -- Emptied here (a list empty from the start was taken off the index when it emptied).
      if looked > 0 then redis.call('SREM', lim_base .. '~parked', lk) end
      return released, 0, looked
    end
    looked = looked + 1
    local prk = base .. ptid
    local p = redis.call('HMGET', prk, 'status', 'eid', 'prio', 'exp', 'lc', 'grp')
    if p[1] == 'queued' and not p[2] then
      local live = true
      if p[4] then
        now = now or now_ms()
        live = tonumber(p[4]) > now
      end
      if live and n == nil then
        n = math.max(0, tonumber(p[5] or '1') - redis.call('ZCARD', lim_base .. lk .. ':run'))
        if n == 0 then
          redis.call('LPUSH', held, ptid)
          return released, 0, looked
        end
      end
      group_requeue(streams, base, prk, ptid, p[3], p[6])
      if live then
        redis.call('HSET', prk, 'lown', '1')
        released = released + 1
      end
    end
  end
  if redis.call('EXISTS', held) == 0 then redis.call('SREM', lim_base .. '~parked', lk) end
  return released, 0, looked
end
