-- retention_dlq.lua: prune one queue's dead-letter zset, oldest first, in a bounded pass.
--
-- An entry goes when it is older than the DLQ age, when its record is gone (expired) or no
-- longer failed (requeued elsewhere), or when the zset holds more than the cap; a failed record
-- dropped for the cap is deleted with its entry.
--
-- KEYS[1]  P:{q}:dlq
-- KEYS[2]  P:{q}:t:     (task record key prefix)
-- ARGV[1]  age (ms): entries that failed at least this long ago go, measured on the Redis clock
--          (a worker's clock may be skewed), ARGV[2] cap (0 = none),
-- ARGV[3]  most entries to look at in this call
-- Returns  {removed, remaining}
-- include: now_ms

local cutoff = now_ms() - tonumber(ARGV[1])
local cap, budget = tonumber(ARGV[2]), tonumber(ARGV[3])
local base = KEYS[2]
local removed = 0
local n = redis.call('ZCARD', KEYS[1])
local over = 0
if cap > 0 and n > cap then over = n - cap end
local oldest = redis.call('ZRANGE', KEYS[1], 0, budget - 1, 'WITHSCORES')
for j = 1, #oldest, 2 do
  local tid, score = oldest[j], tonumber(oldest[j + 1])
  local rk = base .. tid
  local status = redis.call('HGET', rk, 'status')
  if over > 0 or score <= cutoff or status ~= 'failed' then
    redis.call('ZREM', KEYS[1], tid)
    if over > 0 and status == 'failed' then redis.call('DEL', rk) end
    if over > 0 then over = over - 1 end
    removed = removed + 1
  end
end
return {removed, redis.call('ZCARD', KEYS[1])}
