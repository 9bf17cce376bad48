-- How many KEYS the caller gave, not counting the slot guard dtq appends on a Redis Cluster: a
-- declared key that never exists, so no script runs while its slot migrates (dtq/scripts/runner.py).
local function nkeys()
  local n = #KEYS
  if n > 0 and string.sub(KEYS[n], -11) == ':~slotguard' then return n - 1 end
  return n
end
