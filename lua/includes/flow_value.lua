-- The value of expression expr: each step index replaced by that step's result JSON.
local function flow_value(fkey, expr)
  return (string.gsub(expr, '%d+', function(m) return redis.call('HGET', fkey, 'r' .. m) end))
end
