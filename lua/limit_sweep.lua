-- limit_sweep.lua: keep tasks parked behind a concurrency limit moving (dtq/limits.py).
--
-- The end of each limited run releases one parked task (see includes/limit_release.lua), looking at a bounded
-- number of parked ids; when dead ids (cancelled, expired, purged) use that up, the key is owed
-- a release in <lim:>~owed and this script, called by the scheduler each tick with no keys,
-- goes on from there. Should a run vanish without ending (its record purged), its place is
-- dropped here and as many parked tasks are released as the limit has room for (retention
-- calls it with the keys its SCAN found). One call looks at no more than 5000 parked ids.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:t:
-- KEYS[12]     P:{q}:lim:  (prefix: <lim:>k:run, <lim:>k:held, the sets <lim:>~owed, ~parked)
-- ARGV[1..]    limit keys to sweep; none: the keys owed a release (<lim:>~owed)
-- Returns      {parked tasks released, more: 1 when the budget ran out (call again)}
-- include: limit_unpark

local base, lim_base = KEYS[11], KEYS[12]
local owed = lim_base .. '~owed'
local budget = 5000
local lks = ARGV
if #lks == 0 then lks = redis.call('SRANDMEMBER', owed, 100) end
local released, more = 0, 0
for _, lk in ipairs(lks) do
  if budget <= 0 then
    more = 1
    break
  end
  local lb = lim_base .. lk
  local run = lb .. ':run'
  local m = redis.call('ZRANGE', run, 0, -1, 'WITHSCORES')
  for j = 1, #m, 2 do
    local s = redis.call('HMGET', base .. m[j], 'status', 'attempt')
    if s[1] ~= 'running' or tonumber(s[2]) ~= tonumber(m[j + 1]) then
      redis.call('ZREM', run, m[j])
    end
  end
  local n, left, looked = limit_unpark(lim_base, lk, base, KEYS, nil, budget)
  released = released + n
  budget = budget - looked
  if left == 1 then
    redis.call('SADD', owed, lk)
    more = 1
  else
    redis.call('SREM', owed, lk)
  end
end
if more == 0 and #ARGV == 0 and #lks == 100 and redis.call('EXISTS', owed) == 1 then more = 1 end
return {released, more}
