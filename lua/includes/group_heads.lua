-- The heads of group grp's lists, bands 9..0 (nil where none: no turn in that band; '~' where
-- withheld; else the tid of the live turn). One EXISTS of the ten lists, then a LINDEX per band
-- until every existing list was read.
local function group_heads(gb, grp)
  local keys = {}
  for j = 1, 10 do keys[j] = gb .. 'w:' .. (10 - j) .. ':' .. grp end
  local n = redis.call('EXISTS', unpack(keys))
  local heads = {}
  for j = 1, 10 do
    if n == 0 then break end
    heads[j] = redis.call('LINDEX', keys[j], '0')
    if heads[j] then n = n - 1 end
  end
  return heads
end
