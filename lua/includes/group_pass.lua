-- include: group_issue
-- include: group_settle
-- include: record_defaults
-- A waiting task of group grp (band prio) leaves without starting (cancelled, expired, parked
-- behind a limit, found a duplicate): if it held the group's turn, the turn passes on.
local function group_pass(gb, streams, tbase, prio, grp, tid)
  prio = prio or DEF_PRIO
  local f = prio .. ':' .. grp
  local turn = redis.call('HGET', gb .. 'tk', f)
  if turn == tid then
    group_issue(gb, streams, tbase, prio, grp)
  else
    local w = gb .. 'w:' .. f
    redis.call('LREM', w, 1, tid)
    -- A withheld turn with no task left behind it goes too.
    if turn == '~' and redis.call('EXISTS', w) == 0 then redis.call('HDEL', gb .. 'tk', f) end
  end
  group_settle(gb, streams, tbase, grp)
end
