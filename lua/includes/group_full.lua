-- Whether group grp runs cap tasks or more (members whose record no longer runs that attempt,
-- e.g. purged, are dropped first).
local function group_full(gb, tbase, grp, cap)
  local run = gb .. 'run:' .. grp
  local n = redis.call('ZCARD', run)
  if n < cap then return false end
  local m = redis.call('ZRANGE', run, 0, -1, 'WITHSCORES')
  for j = 1, #m, 2 do
    local s = redis.call('HMGET', tbase .. m[j], 'status', 'attempt')
    if s[1] ~= 'running' or tonumber(s[2] or '0') ~= tonumber(m[j + 1]) then
      redis.call('ZREM', run, m[j])
      n = n - 1
    end
  end
  return n >= cap
end
