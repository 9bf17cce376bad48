-- include: group_base
-- include: now_ms
-- include: record_defaults
-- The group keys' prefix of the queue whose record prefix is group_put_tb (one queue per
-- call: found once, not per task), and whether that queue has a paused group: read once per
-- call, by the first task that makes its group's list, so a bulk enqueue of many new groups
-- reads no paused set per group while none is paused. (No script that puts tasks pauses a
-- group.)
local group_put_tb, group_put_gb, group_put_any_paused = nil, nil, nil
-- Where a task that is to wait (queued) goes: returns its stream entry's id when it gets one
-- (its group's turn; or no group while no group is active), else false (it waits in its group's
-- list: the caller clears the record's eid); and the group to store as the record's grp when
-- that changes ('' for an ungrouped task while groups are active; false: none, for a task of
-- group '' that comes back to waiting while no group is active: it waits as a plain task),
-- else nil.
-- stream: the task's band's stream; prio: its band (a digit, nil for the default); grp: its
-- record's grp (nil: none); gmode: whether groups are active (nil: not known yet); gidx
-- (optional, a bulk enqueue's): a list collecting the new groups' index entries (score,
-- group, ...) for the caller to add by one ZADD NX at its end (added here at 400 values);
-- since (optional): the call's time (ms, text), the new group's score in the index, else the
-- milliseconds of its turn's entry.
local function group_put(stream, tbase, tid, prio, grp, gmode, gidx, since)
  prio = prio or DEF_PRIO
  if tbase ~= group_put_tb then
    group_put_tb, group_put_gb, group_put_any_paused = tbase, group_base(tbase), nil
  end
  local gb = group_put_gb
  local store = nil
  if not grp or grp == '' then
    if gmode == nil then gmode = redis.call('EXISTS', gb .. 'idx') == 1 end
    if not gmode then
      local drop = nil
      if grp == '' then drop = false end
      return redis.call('XADD', stream, '*', 't', tid), drop
    end
    if grp ~= '' then store = '' end
    grp = ''
  end
  local w = gb .. 'w:' .. prio .. ':' .. grp
  -- (A group with a turn, live or withheld, is among the active groups already.)
  if redis.call('RPUSH', w, tid) > 1 then return false, store end
  if group_put_any_paused == nil then
    group_put_any_paused = redis.call('EXISTS', gb .. 'paused') == 1
  end
  if group_put_any_paused and redis.call('SISMEMBER', gb .. 'paused', grp) == 1 then
    redis.call('LPUSH', w, '~')
    redis.call('ZADD', gb .. 'idx', 'NX', now_ms(), grp)
    return false, store
  end
  local eid = redis.call('XADD', stream, '*', 't', tid)
  -- (Active since the entry's milliseconds: the server's clock, without a TIME call.)
  since = since or string.sub(eid, 1, string.find(eid, '-', 1, true) - 1)
  if gidx then
    local k = #gidx
    gidx[k + 1] = since
    gidx[k + 2] = grp
    if k >= 398 then  -- (400: unpack's bound on the Lua stack)
      redis.call('ZADD', gb .. 'idx', 'NX', unpack(gidx))
      for j = k + 2, 1, -1 do gidx[j] = nil end
    end
  else
    redis.call('ZADD', gb .. 'idx', 'NX', since, grp)
  end
  return eid, store
end
