-- lock.lua: acquire or refresh a leader lock (compare-and-set on the holder's token).
--
-- KEYS[1]  the lock key
-- ARGV[1]  token (worker id), ARGV[2] lease in ms
-- Returns  1 when the caller holds the lock after the call, 0 otherwise

local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
