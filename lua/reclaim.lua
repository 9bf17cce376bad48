-- reclaim.lua: adopt entries idle past the visibility timeout (their worker died or froze).
--
-- XAUTOCLAIM and the state change run in one script, so exactly one reclaimer wins an entry.
-- A lost run spends one retry (the run may have had effects); the task goes back to its queue
-- as a new entry, to be claimed like any other (the claim then raises the attempt, which fences
-- out the old run). Past its retry budget it ends "failed" with the reason "worker lost"
-- (a poison pill that kills every worker that runs it). Entries whose record is not running
-- that very entry are duplicates: acknowledged and absorbed.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:dlq
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:stats
-- KEYS[14]     P:{q}:t:
-- KEYS[15]     P:{q}:idem:
-- KEYS[16]     P:{q}:lim:  (limit key prefix: a lost limited run frees its place)
-- ARGV[1]      group, ARGV[2] reclaimer's worker id, ARGV[3] min idle ms (visibility timeout),
-- ARGV[4]      max entries to adopt per stream, ARGV[5] events maxlen,
-- ARGV[6]      record TTL (s) of a failed task, ARGV[7] done channel prefix
-- Returns      {requeued, failed, absorbed}

local group, worker = ARGV[1], ARGV[2]
local min_idle, count = tonumber(ARGV[3]), tonumber(ARGV[4])
local maxlen, ttl, done_prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local base = KEYS[14]
local now = now_ms()
local requeued, failed, absorbed = 0, 0, 0
for i = 1, 10 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local res = redis.call('XAUTOCLAIM', KEYS[i], group, worker, min_idle, '0-0', 'COUNT', count)
    for _, entry in ipairs(res[2]) do
      local eid, fields = entry[1], entry[2]
      local tid = fields[2]
      local rk = base .. tid
      local r = redis.call('HMGET', rk, 'status', 'eid', 'attempt', 'worker', 'retries', 'maxr')
      drop_entry(KEYS[i], group, eid)
      if r[1] == 'running' and r[2] == eid then
        limit_release(KEYS[16], base, KEYS, rk, tid)
        local retries = tonumber(r[5]) + 1
        local err = 'worker lost: ' .. (r[4] or '?') .. ' stopped heartbeating during attempt '
          .. r[3]
        redis.call('HSET', rk, 'retries', retries, 'error', err)
        redis.call('HDEL', rk, 'worker')
        if retries <= tonumber(r[6]) then
          local neid = redis.call('XADD', KEYS[i], '*', 't', tid)
          redis.call('HSET', rk, 'status', 'queued', 'eid', neid)
          emit(KEYS[12], maxlen, 'reclaimed', tid, r[3], worker, err)
          requeued = requeued + 1
        else
          redis.call('ZADD', KEYS[11], now, tid)
          finish(rk, 'failed', now, ttl, done_prefix .. tid, KEYS[15])
          emit(KEYS[12], maxlen, 'failed', tid, r[3], worker, err)
          failed = failed + 1
        end
      else
        redis.call('HINCRBY', KEYS[13], 'absorbed', 1)
        emit(KEYS[12], maxlen, 'absorbed', tid, r[3], worker, eid)
        absorbed = absorbed + 1
      end
    end
  end
end
return {requeued, failed, absorbed}
