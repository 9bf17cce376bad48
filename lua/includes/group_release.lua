-- include: group_issue
-- A withheld turn of group grp in band prio goes out: '~' leaves the head, the next task gets
-- its entry (group_issue). Returns its tid, or nil.
local function group_release(gb, streams, prio, grp)
  local w = gb .. 'w:' .. prio .. ':' .. grp
  redis.call('LPOP', w)
  return group_issue(gb, streams, prio, grp, w)
end
