-- swap.lua: set a string key to a new value only while it holds the expected one (compare and
-- set): the schema move from 1 to 2 (dtq_worker/schema_move.py), which several workers may try
-- at once; of two that saw the same value, one moves it.
--
-- KEYS[1]  the key (P:schema)
-- ARGV[1]  the value expected, ARGV[2] the new value
-- Returns  1 set, 0 the key held something else (nothing written)

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
