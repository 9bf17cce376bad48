-- schedule_put.lua: create or update one periodic schedule.
--
-- An unchanged definition keeps its stored next fire time (a restart never resets or repeats
-- a schedule); a new or changed one starts from the next fire time the caller computed.
--
-- KEYS[1]  P:{q}:schedules       (hash name -> definition JSON)
-- KEYS[2]  P:{q}:schedules:next  (zset name -> next fire ms)
-- ARGV[1]  schedule name, ARGV[2] definition JSON, ARGV[3] next fire time (ms)
-- Returns  1 created or changed, 0 unchanged

local name, spec = ARGV[1], ARGV[2]
if redis.call('HGET', KEYS[1], name) == spec and redis.call('ZSCORE', KEYS[2], name) then
  return 0
end
redis.call('HSET', KEYS[1], name, spec)
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), name)
return 1
