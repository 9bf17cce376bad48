-- retention_hist.lua: fold one queue's closed per-minute enqueue counters (enqueue.lua's
-- P:{q}:he:<minute>, one INCR per single enqueue: the cheapest count it can make) into the
-- enqueued slot of their hour strings P:{q}:h:<hour> (dtq/stats.py), so a queue keeps about one
-- history key per hour, not one per minute. The GETDEL and the add are one step: a reader's
-- MGET of both (dtq/stats.py, read) sees each count once. A counter no pass folds (no worker
-- ran) stays readable until its own TTL.
--
-- KEYS[1..n]    the minute counters P:{q}:he:<minute> to fold (most do not exist)
-- KEYS[n+1..]   the hour strings P:{q}:h:<hour> of those minutes
-- ARGV[1]       n
-- ARGV[2..n+1]  per counter: the KEYS index of its hour string
-- ARGV[n+2..2n+1] per counter: its enqueued slot in that string, as BITFIELD's '#<index>'
-- ARGV[2n+2..]  per hour string: its expiry (unix s; what the outcome scripts give it)
-- Returns       the number of counters folded

local n = tonumber(ARGV[1])
local folded, touched = 0, {}
for i = 1, n do
  local c = redis.call('GETDEL', KEYS[i])
  if c then
    local hi = tonumber(ARGV[1 + i])
    redis.call('BITFIELD', KEYS[hi], 'INCRBY', 'u32', ARGV[1 + n + i], c)
    touched[hi] = true
    folded = folded + 1
  end
end
for hi in pairs(touched) do
  redis.call('EXPIREAT', KEYS[hi], ARGV[1 + n + hi])
end
return folded
