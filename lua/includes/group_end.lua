-- include: group_heads
-- include: group_release
-- include: group_settle
-- n runs of group grp ended or went back to waiting: they leave the group's running count; a
-- turn withheld by the cap goes out again (the highest band's: one run ended, one may start),
-- unless the group is paused.
-- band (a band digit of the runs): given by a caller without a cap (complete.lua, its worker's
-- DTQ_GROUP_CONCURRENCY 0 for the queue), with n up to a batch of the group's ended runs. Then
-- while the group runs other tasks, or has a live turn in that band, nothing else is read:
-- without caps a turn is withheld only by a pause, which a run's end does not lift; a turn
-- another worker's cap withheld goes out at the end of the group's last run (group_settle)
-- instead, as the group still runs or has a live turn.
local function group_end(gb, streams, grp, n, band)
  local running = redis.call('DECRBY', gb .. 'run:' .. grp, n)
  if band then
    if running > 0 then return end
    local h = redis.call('LINDEX', gb .. 'w:' .. band .. ':' .. grp, 0)
    if h and h ~= '~' then return end
  end
  local heads = group_heads(gb, grp)
  local held = false
  for j = 1, 10 do
    if heads[j] == '~' then held = true end
  end
  if held and redis.call('SISMEMBER', gb .. 'paused', grp) == 0 then
    for j = 1, 10 do
      if heads[j] == '~' then
        heads[j] = group_release(gb, streams, string.format('%d', 10 - j), grp)
        if heads[j] then break end
      end
    end
  end
  group_settle(gb, streams, grp, heads, running)
end
