-- limit_sweep.lua: keep tasks parked behind a concurrency limit moving (dtq/limits.py).
--
-- The end of each limited run releases one parked task (see _common.lua). Should a run vanish
-- without ending (its record purged), its place is dropped here and as many parked tasks are
-- released as the limit has room for.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:t:
-- KEYS[12]     P:{q}:lim:
-- ARGV[1..]    limit keys that have parked tasks
-- Returns      number of parked tasks released

local base, lim_base = KEYS[11], KEYS[12]
local released = 0
for _, lk in ipairs(ARGV) do
  local lb = lim_base .. lk
  local run = lb .. ':run'
  local m = redis.call('ZRANGE', run, 0, -1, 'WITHSCORES')
  for j = 1, #m, 2 do
    local s = redis.call('HMGET', base .. m[j], 'status', 'attempt')
    if s[1] ~= 'running' or tonumber(s[2]) ~= tonumber(m[j + 1]) then
      redis.call('ZREM', run, m[j])
    end
  end
  local first = redis.call('LINDEX', lb .. ':held', 0)
  if first then
    local lc = tonumber(redis.call('HGET', base .. first, 'lc') or '1')
    local room = math.max(0, lc - redis.call('ZCARD', run))
    if room > 0 then released = released + limit_unpark(lb, base, KEYS, room) end
  end
end
return released
