-- include: group_put
-- include: stream_index
-- group_put for a task whose record rk exists: writes the record's eid (or clears it) and grp.
-- Returns the entry id or false.
local function group_requeue(streams, tbase, rk, tid, prio, grp)
  local eid, store = group_put(streams[stream_index(prio)], tbase, tid, prio, grp)
  if eid then
    if store then redis.call('HSET', rk, 'eid', eid, 'grp', store)
    else redis.call('HSET', rk, 'eid', eid) end
    if store == false then redis.call('HDEL', rk, 'grp') end
  else
    redis.call('HDEL', rk, 'eid')
    if store then redis.call('HSET', rk, 'grp', store) end
  end
  return eid
end
