-- include: emit
-- The events maxlen of this call from its ARGV text (returns the number): emit then sends the
-- text as it came instead of formatting the number again.
local function events_maxlen(text)
  maxlen_n, maxlen_s = tonumber(text), text
  return maxlen_n
end
