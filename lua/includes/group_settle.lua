-- include: group_heads
-- include: group_release
-- After a task of group grp left its turn, its list or its running count: when nothing of the
-- group runs and it has no live turn, a turn withheld by the cap goes out again (the highest
-- band's; unless the group is paused): no run is left whose end would give it back. When nothing
-- of it waits or runs, grp leaves the active groups and its running count (g:run:<group>, kept
-- at 0 while the group is active: no key made and deleted per run) goes. heads: group_heads's, or nil; running: the group's running
-- count when the caller has it (group_end), or nil.
local function group_settle(gb, streams, grp, heads, running)
  local counted = true  -- (whether the group has its running count)
  if not running then
    local v = redis.call('GET', gb .. 'run:' .. grp)
    counted, running = v ~= false, tonumber(v or '0')
  end
  if running > 0 then return end
  heads = heads or group_heads(gb, grp)
  local live, held = false, false
  for j = 1, 10 do
    if heads[j] == '~' then held = true elseif heads[j] then live = true end
  end
  if held and not live and redis.call('SISMEMBER', gb .. 'paused', grp) == 0 then
    for j = 1, 10 do
      if heads[j] == '~' then
        heads[j] = group_release(gb, streams, string.format('%d', 10 - j), grp)
        if heads[j] then break end
      end
    end
  end
  for j = 1, 10 do
    if heads[j] then return end
  end
  redis.call('ZREM', gb .. 'idx', grp)
  if counted then redis.call('DEL', gb .. 'run:' .. grp) end
end
