-- The server's time in milliseconds: as a number, and as the text to store.
local function now_ms()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return ms, string.format('%d', ms)
end
