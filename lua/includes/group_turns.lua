-- The turn fields of group grp, bands 9..0 (HMGET: nil where none).
local function group_turns(gb, grp)
  return redis.call('HMGET', gb .. 'tk', '9:' .. grp, '8:' .. grp, '7:' .. grp, '6:' .. grp,
    '5:' .. grp, '4:' .. grp, '3:' .. grp, '2:' .. grp, '1:' .. grp, '0:' .. grp)
end
