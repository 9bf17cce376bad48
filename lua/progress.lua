-- progress.lua: store a running task's progress report and announce it as an event.
--
-- Fenced like complete.lua: only the run that holds the task (status running, this attempt,
-- this worker) may write, so a late report of an old run never shows on a newer one.
--
-- KEYS[1]  P:{q}:t:<tid>  (the task record)
-- KEYS[2]  P:{q}:events
-- ARGV[1]  tid, ARGV[2] attempt, ARGV[3] worker id, ARGV[4] progress JSON,
-- ARGV[5]  events maxlen
-- Returns  1 stored, 0 rejected (the run no longer holds the task)
-- include: emit

local r = redis.call('HMGET', KEYS[1], 'status', 'attempt', 'worker')
if r[1] ~= 'running' or r[2] ~= ARGV[2] or r[3] ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[4])
emit(KEYS[2], tonumber(ARGV[5]), 'progress', ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 1
