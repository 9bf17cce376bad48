-- include: group_heads
-- include: group_release
-- include: group_settle
-- n runs of group grp ended or went back to waiting: they leave the group's running count; a
-- turn withheld by the cap goes out again (the highest band's: one run ended, one may start),
-- unless the group is paused.
-- band (a band digit of the runs): given by a caller without a cap (complete.lua, its worker's
-- DTQ_GROUP_CONCURRENCY 0 for the queue), with n up to a batch of the group's ended runs. Then
-- nothing else is read unless the count says that the last run ended with the group's mark set
-- (group_settle): while the group runs other tasks there is nothing to do; and a group none of
-- whose turns ended while it ran still has them (without caps a turn is withheld only by a
-- pause, which a run's end does not lift; a claim that withholds a turn for a cap marks the
-- group, so a worker without a cap gives that turn back at the group's last run's end).
local function group_end(gb, streams, grp, n, band)
  -- (A number given to redis.call is formatted with "%.17g": DECR when one run ended.)
  local v
  if n == 1 then v = redis.call('DECR', gb .. 'run:' .. grp)
  else v = redis.call('DECRBY', gb .. 'run:' .. grp, string.format('%d', n)) end
  if band and (v < GROUP_MARK or v % GROUP_MARK > 0) then return end
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
  group_settle(gb, streams, grp, heads, v)
end
