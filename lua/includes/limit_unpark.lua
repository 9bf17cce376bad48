-- include: group_requeue
-- include: now_ms
-- Limits: the keys and their invariants, docs/design.md, "Fair groups and limits in the scripts".
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
