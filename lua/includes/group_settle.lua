-- include: group_heads
-- include: group_release
-- After a task of group grp left its turn, its list or its running set: when nothing of the group
-- runs and it has no live turn, a turn withheld by the cap goes out again (the highest band's;
-- unless the group is paused): no run is left whose end would give it back. When nothing of it
-- waits or runs, grp leaves the active groups. heads: group_heads's, or nil.
local function group_settle(gb, streams, tbase, grp, heads)
  if redis.call('EXISTS', gb .. 'run:' .. grp) == 1 then return end
  heads = heads or group_heads(gb, grp)
  local live, held = false, false
  for j = 1, 10 do
    if heads[j] == '~' then held = true elseif heads[j] then live = true end
  end
  if held and not live and redis.call('SISMEMBER', gb .. 'paused', grp) == 0 then
    for j = 1, 10 do
      if heads[j] == '~' then
        heads[j] = group_release(gb, streams, tbase, string.format('%d', 10 - j), grp)
        if heads[j] then break end
      end
    end
  end
  for j = 1, 10 do
    if heads[j] then return end
  end
  redis.call('ZREM', gb .. 'idx', grp)
end
