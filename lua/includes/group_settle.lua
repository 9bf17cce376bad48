-- include: group_issue
-- include: group_turns
-- After a task of group grp left its turn, its list or its running set: when nothing of the group
-- runs and no turn of it is in a stream, a turn withheld by the cap goes out again (the highest
-- band's; unless the group is paused): no run is left whose end would give it back. When
-- nothing of it waits or runs, grp leaves the active groups. turns: group_turns's, or nil.
local function group_settle(gb, streams, tbase, grp, turns)
  if redis.call('EXISTS', gb .. 'run:' .. grp) == 1 then return end
  turns = turns or group_turns(gb, grp)
  local live = false
  for j = 1, 10 do
    if turns[j] and turns[j] ~= '~' then live = true end
  end
  if not live and redis.call('SISMEMBER', gb .. 'paused', grp) == 0 then
    for j = 1, 10 do
      if turns[j] == '~' then
        turns[j] = group_issue(gb, streams, tbase, string.format('%d', 10 - j), grp)
        if turns[j] then break end
      end
    end
  end
  for j = 1, 10 do
    if turns[j] then return end
  end
  redis.call('ZREM', gb .. 'idx', grp)
end
