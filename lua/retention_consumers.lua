-- retention_consumers.lua: delete a queue's stream consumers that are idle past an age and hold
-- no pending entry. The look at each consumer and its delete are one atomic step: a claim cannot
-- land in between, so no pending entry is ever deleted with its consumer (it would be lost for
-- good: XAUTOCLAIM only sees pending entries).
--
-- KEYS[1..10]  priority streams p9..p0
-- ARGV[1]      consumer group, ARGV[2] idle age (ms) past which an empty consumer goes
-- Returns      number of consumers deleted
-- include: nkeys

local group, idle_ms = ARGV[1], tonumber(ARGV[2])
local removed = 0
for i = 1, nkeys() do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[i], group)
    if not consumers.err then  -- no group on this stream yet
      for _, c in ipairs(consumers) do
        local name, pending, idle = nil, nil, nil
        for j = 1, #c, 2 do
          if c[j] == 'name' then name = c[j + 1]
          elseif c[j] == 'pending' then pending = tonumber(c[j + 1])
          elseif c[j] == 'idle' then idle = tonumber(c[j + 1]) end
        end
        if name and pending == 0 and idle and idle >= idle_ms then
          redis.call('XGROUP', 'DELCONSUMER', KEYS[i], group, name)
          removed = removed + 1
        end
      end
    end
  end
end
return removed
