-- group_hold.lua: pause or resume one fair group of a queue (docs/groups.md).
--
-- A paused group starts nothing: the claim that meets its turn withholds it (the task stays at
-- the head of the group's list, '~' in front of it: docs/groups.md); tasks enqueued meanwhile wait
-- in the list. The resume gives each band's withheld turn back (at the end of the band's stream:
-- behind the groups that kept running). Other groups and the queue are not touched.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:g:   (group key prefix)
-- KEYS[12]     P:{q}:events
-- ARGV[1]      group, ARGV[2] '1' pause | '0' resume, ARGV[3] events maxlen
-- Returns      1 when the group's state changed, 0 when it was so already
-- include: emit
-- include: events_maxlen
-- include: group_heads
-- include: group_release
-- include: group_settle

local gb, grp = KEYS[11], ARGV[1]
local maxlen = events_maxlen(ARGV[3])
if ARGV[2] == '1' then
  if redis.call('SADD', gb .. 'paused', grp) == 0 then return 0 end
  emit(KEYS[12], maxlen, 'group_paused', '', '', '', grp)
  return 1
end
if redis.call('SREM', gb .. 'paused', grp) == 0 then return 0 end
local heads = group_heads(gb, grp)
for j = 1, 10 do
  if heads[j] == '~' then
    heads[j] = group_release(gb, KEYS, string.format('%d', 10 - j), grp)
  end
end
group_settle(gb, KEYS, grp, heads)
emit(KEYS[12], maxlen, 'group_resumed', '', '', '', grp)
return 1
