-- complete.lua: end one or more runs "succeeded" (or "cancelled"), fenced by attempt.
--
-- A run may write its outcome only while the record still says it is running this very
-- attempt on this worker. A stale writer (its run was reclaimed, cancelled or requeued) is
-- rejected, counted in stats.stale_writes, and touches nothing else: the entry then belongs to
-- someone else.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:events
-- KEYS[12]     P:{q}:stats
-- KEYS[13]     P:{q}:t:
-- KEYS[14]     P:{q}:idem:
-- KEYS[15]     P:{q}:lim:  (limit key prefix: a limited run frees its place, see _common.lua)
-- ARGV[1]      group, ARGV[2] worker id, ARGV[3] events maxlen, ARGV[4] record TTL (s),
-- ARGV[5]      done channel prefix, ARGV[6] n
-- ARGV[7..]    per run, 5 fields: tid, eid, attempt, status ('succeeded' | 'cancelled'),
--              payload (the result JSON, or the cancel reason)
-- Returns      list of n integers: 1 stored, 0 rejected (stale)

local group, worker = ARGV[1], ARGV[2]
local maxlen, ttl, done_prefix = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local n = tonumber(ARGV[6])
local base = KEYS[13]
local now = now_ms()
local out = {}
local acks = {}  -- stream index -> entry ids: acknowledged and deleted once per stream, at the end
for i = 0, n - 1 do
  local o = 7 + i * 5
  local tid, eid, attempt = ARGV[o], ARGV[o + 1], ARGV[o + 2]
  local status, payload = ARGV[o + 3], ARGV[o + 4]
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'status', 'attempt', 'worker', 'prio', 'idem', 'lk', 'error',
    'cancel')
  if r[1] == 'running' and r[2] == attempt and r[3] == worker then
    local si = stream_index(r[4])
    local ids = acks[si]
    if ids then ids[#ids + 1] = eid else acks[si] = {eid} end
    if r[6] then limit_release(KEYS[15], base, KEYS, rk, tid) end
    if status == 'succeeded' then
      if r[7] then redis.call('HDEL', rk, 'error') end
      if r[5] then
        redis.call('HSET', rk, 'result', payload)
        finish(rk, status, now, ttl, done_prefix .. tid, KEYS[14])
      else
        -- finish() for a task without an idempotency key, in one HSET instead of three calls.
        redis.call('HSET', rk, 'result', payload, 'status', status, 'finished', now)
        redis.call('EXPIRE', rk, ttl)
        redis.call('PUBLISH', done_prefix .. tid, status)
      end
    else
      -- The canceller's reason (the durable cancel flag) wins over the worker's generic one.
      redis.call('HSET', rk, 'error', r[8] or payload)
      finish(rk, status, now, ttl, done_prefix .. tid, KEYS[14])
    end
    emit(KEYS[11], maxlen, status, tid, attempt, worker, '')
    out[#out + 1] = 1
  else
    redis.call('HINCRBY', KEYS[12], 'stale_writes', 1)
    out[#out + 1] = 0
  end
end
for si, ids in pairs(acks) do
  redis.call('XACK', KEYS[si], group, unpack(ids))
  redis.call('XDEL', KEYS[si], unpack(ids))
end
return out
