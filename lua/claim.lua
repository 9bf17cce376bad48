-- claim.lua: take up to COUNT new entries of one queue, highest priority first, and start them.
--
-- Reading (XREADGROUP) and the queued -> running transition happen in this one script, so an
-- entry is started at most once across all workers, a worker never takes more entries than it
-- has free slots (COUNT is spent across the bands, not per band) and never starts a lower band
-- while a higher one has entries.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:paused  (while it exists nothing is claimed)
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:stats
-- KEYS[14]     P:{q}:t:      (task record key prefix)
-- KEYS[15]     P:{q}:idem:
-- ARGV[1]      consumer group
-- ARGV[2]      worker id (consumer name)
-- ARGV[3]      count: free slots
-- ARGV[4]      events maxlen
-- ARGV[5]      record TTL in seconds (for tasks found expired)
-- ARGV[6]      done channel prefix
-- Returns      {now_ms, absorbed, expired, n, then 13 fields per started task:
--               tid, eid, attempt, name, args, kwargs, max_retries, timeout, retries,
--               interruptions, enqueued_ms, priority, idem}
--              {now_ms, -1} when the queue is paused, {now_ms, -2} when a priority stream is
--              missing (the worker then recreates the streams and the group).
-- Errors       NOGROUP when a stream or the group is missing (the worker recreates them).

local group, worker = ARGV[1], ARGV[2]
local remaining = tonumber(ARGV[3])
local maxlen = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local done_prefix = ARGV[6]
local base = KEYS[14]
local now = now_ms()
if redis.call('EXISTS', KEYS[11]) == 1 then
  return {now, -1}
end
if redis.call('EXISTS', unpack(KEYS, 1, 10)) < 10 then
  return {now, -2}
end
local started = {}
local absorbed, expired = 0, 0
for i = 1, 10 do
  if remaining <= 0 then break end
  local res = redis.call('XREADGROUP', 'GROUP', group, worker, 'COUNT', remaining,
    'STREAMS', KEYS[i], '>')
  -- res[1][2] on Redis; fakeredis (dtq.testing) answers {} for nil and flattens the reply.
  if res and res[1] then
    for _, entry in ipairs(res[1][2] or res[2]) do
      local eid, fields = entry[1], entry[2]
      local tid = fields[2]
      local rk = base .. tid
      local r = redis.call('HMGET', rk, 'status', 'eid', 'exp', 'attempt', 'name', 'args',
        'kwargs', 'maxr', 'timeout', 'retries', 'intr', 'enq', 'prio', 'idem')
      if r[1] == 'queued' and r[2] == eid then
        if r[3] and tonumber(r[3]) <= now then
          drop_entry(KEYS[i], group, eid)
          redis.call('HSET', rk, 'error', 'expired before it started')
          finish(rk, 'expired', now, ttl, done_prefix .. tid, KEYS[15])
          emit(KEYS[12], maxlen, 'expired', tid, r[4], worker, '')
          expired = expired + 1
        else
          local attempt = tonumber(r[4]) + 1
          redis.call('HSET', rk, 'status', 'running', 'attempt', attempt, 'worker', worker,
            'started', now)
          emit(KEYS[12], maxlen, 'started', tid, attempt, worker, '')
          local o = #started
          started[o + 1] = tid
          started[o + 2] = eid
          started[o + 3] = attempt
          started[o + 4] = r[5]
          started[o + 5] = r[6]
          started[o + 6] = r[7] or ''
          started[o + 7] = r[8]
          started[o + 8] = r[9] or ''
          started[o + 9] = r[10]
          started[o + 10] = r[11]
          started[o + 11] = r[12]
          started[o + 12] = r[13]
          started[o + 13] = r[14] or ''
          remaining = remaining - 1
        end
      else
        -- A duplicate (or an entry whose task is gone): acknowledged, never run.
        drop_entry(KEYS[i], group, eid)
        redis.call('HINCRBY', KEYS[13], 'absorbed', 1)
        emit(KEYS[12], maxlen, 'absorbed', tid, r[4], worker, eid)
        absorbed = absorbed + 1
      end
    end
  end
end
local out = {now, absorbed, expired, #started / 13}
for _, v in ipairs(started) do out[#out + 1] = v end
return out
