-- unlock.lua: release a leader lock only if the caller still holds it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  token (worker id)
-- Returns  1 released, 0 not the holder

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
