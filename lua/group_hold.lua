-- group_hold.lua: hold (pause) or release (resume) one fair group of a queue: while held, no
-- worker starts a task of the group; running ones finish (docs/groups.md).
--
-- TEMPORARY: this version only adds the group to, or removes it from, the queue's held set;
-- the turn logic's version (which also keeps the group's turns in the streams) replaces it.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:t:      (task record key prefix)
-- KEYS[12]     P:{q}:g:      (the fair-group keys' prefix; the held set is <prefix>paused)
-- KEYS[13]     P:{q}:events
-- ARGV[1]      group name, ARGV[2] '1' hold (pause) | '0' release (resume),
-- ARGV[3]      events maxlen
-- Returns      1 when the group's state changed, 0 when it already was so.

local paused = KEYS[12] .. 'paused'
if ARGV[2] == '1' then
  return redis.call('SADD', paused, ARGV[1])
end
return redis.call('SREM', paused, ARGV[1])
