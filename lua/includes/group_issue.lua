-- include: stream_index
-- The head of group grp's list in band prio gets its stream entry (at the end of the band's
-- stream): the group's turn. The entry names the group (field g) and the task's record is not
-- read or written: the claim that meets the entry starts the task only while its id heads the
-- list and the task waits (queued, no entry of its own), else absorbs the entry and, when the
-- id of a task that no longer waits headed the list, passes the turn on (claim_entries.lua,
-- take()). The head must not be '~'. w: the list's key when the caller has it. Returns the
-- head's id, or nil (no list: no turn).
local function group_issue(gb, streams, prio, grp, w)
  local tid = redis.call('LINDEX', w or gb .. 'w:' .. prio .. ':' .. grp, '0')
  if tid then redis.call('XADD', streams[stream_index(prio)], '*', 't', tid, 'g', grp) end
  return tid
end
