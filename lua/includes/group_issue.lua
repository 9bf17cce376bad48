-- include: stream_index
-- The head of group grp's list in band prio gets its stream entry (at the end of the band's
-- stream): the group's turn. Ids of tasks that no longer wait (cancelled; or a second copy of
-- a task that is both in a limit's held list and here, released while it waited here) are
-- dropped; with none left the list is gone (no turn). The head must not be '~'. w: the
-- list's key when the caller has it. Returns the task's tid, or nil.
local function group_issue(gb, streams, tbase, prio, grp, w)
  w = w or gb .. 'w:' .. prio .. ':' .. grp
  while true do
    local tid = redis.call('LINDEX', w, 0)
    if not tid then return nil end
    local rk = tbase .. tid
    local st = redis.call('HMGET', rk, 'status', 'eid')
    if st[1] == 'queued' and not st[2] then
      redis.call('HSET', rk, 'eid', redis.call('XADD', streams[stream_index(prio)], '*', 't', tid))
      return tid
    end
    redis.call('LPOP', w)
  end
end
