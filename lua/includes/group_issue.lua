-- include: stream_index
-- Give group grp's next waiting task in band prio its turn (a stream entry at the end of the
-- band's stream); ids of tasks that no longer wait (cancelled) are dropped. Without one, the
-- turn field goes. Returns the task's tid, or nil.
local function group_issue(gb, streams, tbase, prio, grp)
  local f = prio .. ':' .. grp
  local w = gb .. 'w:' .. f
  while true do
    local tid = redis.call('LPOP', w)
    if not tid then break end
    local rk = tbase .. tid
    local st = redis.call('HMGET', rk, 'status', 'eid')
    if st[1] == 'queued' and not st[2] then
      redis.call('HSET', rk, 'eid', redis.call('XADD', streams[stream_index(prio)], '*', 't', tid))
      redis.call('HSET', gb .. 'tk', f, tid)
      return tid
    end
  end
  redis.call('HDEL', gb .. 'tk', f)
  return nil
end
