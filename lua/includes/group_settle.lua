-- include: group_heads
-- include: group_release
-- A group's running count (g:run:<group>) is its running tasks plus GROUP_MARK for each turn of
-- the group that ended (its list in a band went) while the group ran, until a settle found the
-- group still active (group_settle): the mark asks the end of its last run to settle it
-- (group_end; without the mark that end reads nothing more: the group still has a turn). The
-- running tasks are the count modulo GROUP_MARK. Text for redis.call: a number given to it is
-- formatted with "%.17g".
local GROUP_MARK, GROUP_MARK_S = 1048576, '1048576'

-- After a task of group grp left its turn, its list or its running count: when nothing of the
-- group runs and it has no live turn, a turn withheld by the cap goes out again (the highest
-- band's; unless the group is paused): no run is left whose end would give it back. When nothing
-- of it waits or runs, grp leaves the active groups and its running count (kept at 0 while the
-- group is active: no key made and deleted per run) goes. heads: group_heads's, or nil; v: the
-- running count when the caller has it (group_end), or nil; mark: a turn of the group may have
-- ended here (a list went), so a group that runs is marked.
local function group_settle(gb, streams, grp, heads, v, mark)
  local counted = true  -- (whether the group has its running count)
  if not v then
    local raw = redis.call('GET', gb .. 'run:' .. grp)
    counted, v = raw ~= false, tonumber(raw or '0')
  end
  if v % GROUP_MARK > 0 then
    if mark and v < GROUP_MARK then redis.call('INCRBY', gb .. 'run:' .. grp, GROUP_MARK_S) end
    return
  end
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
    if heads[j] then  -- still active: a mark is answered
      if v >= GROUP_MARK then redis.call('SET', gb .. 'run:' .. grp, '0') end
      return
    end
  end
  redis.call('ZREM', gb .. 'idx', grp)
  if counted then redis.call('DEL', gb .. 'run:' .. grp) end
end
