-- include: group_issue
-- include: group_settle
-- include: record_defaults
-- A waiting task of group grp (band prio) leaves without starting (cancelled, expired, parked
-- behind a limit, found a duplicate): if it held the group's turn (the head of its list), the
-- turn passes on.
local function group_pass(gb, streams, prio, grp, tid)
  prio = prio or DEF_PRIO
  local w = gb .. 'w:' .. prio .. ':' .. grp
  local head = redis.call('LINDEX', w, '0')
  if head == tid then
    redis.call('LPOP', w)
    group_issue(gb, streams, prio, grp, w)
  else
    redis.call('LREM', w, 1, tid)
    -- A withheld turn with no task left behind it goes too.
    if head == '~' and redis.call('LLEN', w) == 1 then redis.call('DEL', w) end
  end
  group_settle(gb, streams, grp, nil, nil, true)
end
