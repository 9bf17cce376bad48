-- The public flow id ("<home queue>:<ftid>") and step index of a record's flow field.
local function flow_public(fl)
  local home, ftid, i = string.match(fl, ':([%w_%.%-]+)}:f:([^|]+)|(%d+)$')
  return (home or '?') .. ':' .. (ftid or '?'), i or '?'
end
