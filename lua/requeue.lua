-- requeue.lua: hand running tasks back to their queue (shutdown, self-stop), fenced by attempt.
--
-- A hand-back spends no retry while the task's interruptions stay within the budget; past it,
-- the interruption counts as a failed attempt (retry with the given delay, or "failed"). Runs
-- whose body never started (claimed ahead, see DTQ_WORKER_PREFETCH) go back with no
-- interruption counted: ARGV[9] = 'prefetched'. A run whose cancel was requested (the durable cancel
-- flag) ends "cancelled" instead of going back: no retry spent, no interruption counted.
-- A re-send of a hand-back that landed (its reply was lost: the record names this attempt and
-- worker and is no longer running) is answered with the record's status and writes nothing
-- again (fenced like complete.lua).
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:sched
-- KEYS[12]     P:{q}:dlq
-- KEYS[13]     P:{q}:events
-- KEYS[14]     P:{q}:stats
-- KEYS[15]     P:{q}:t:
-- KEYS[16]     P:{q}:idem:
-- KEYS[17]     P:{q}:lim:  (limit key prefix: a limited run frees its place, see includes/limit_release.lua)
-- KEYS[18]     P:{q}:f:, KEYS[19] P:{q}:flowq: a workflow step that ends failed or cancelled
--              fails (cancels) its flow in this same call (includes/flow_note.lua)
-- KEYS[20]     P:{q}:decl:seen  (task name -> ms a live worker last declared it)
-- ARGV[1]      group, ARGV[2] worker id, ARGV[3] events maxlen, ARGV[4] record TTL (s) of a
--              failed task, ARGV[5] done channel prefix, ARGV[6] max interruptions,
-- ARGV[7]      retry delay ms (used once the budget is spent), ARGV[8] n
-- ARGV[9]      what the runs were: 'started' (their bodies began: count an interruption),
--              'prefetched' (claimed ahead, never begun), 'unknown' (their task names are
--              unknown to this worker, see above)
-- ARGV[10]     the declaration grace (ms) when ARGV[9] is 'unknown'
-- ARGV[11..]   per run, 3 fields: tid, eid, attempt
-- Returns      list of n: 'queued' | 'scheduled' | 'failed' | 'cancelled' | 'stale' |
--              'unknown'; for a re-send, the status the record has now
-- include: drop_entry
-- include: emit
-- include: end_cancelled
-- include: flow_note
-- include: group_base
-- include: group_end
-- include: group_requeue
-- include: limit_release
-- include: now_ms
-- include: run_fence
-- include: spend_retry
-- include: stream_index

local group, worker = ARGV[1], ARGV[2]
local maxlen, ttl, done_prefix = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local max_intr, delay, n = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local interrupted = ARGV[9] == 'started'
local unknown, grace = ARGV[9] == 'unknown', tonumber(ARGV[10])
if not interrupted and not unknown and ARGV[9] ~= 'prefetched' then
  return redis.error_reply('DTQ_BAD_CALL unknown hand-back kind ' .. tostring(ARGV[9]))
end
local base = KEYS[15]
local now = now_ms()
local k = {sched = KEYS[11], dlq = KEYS[12], events = KEYS[13], idem_base = KEYS[16],
  maxlen = maxlen, ttl = ttl, done_prefix = done_prefix, now = now, worker = worker}
local out = {}
for i = 0, n - 1 do
  local o = 11 + i * 3
  local tid, eid, attempt = ARGV[o], ARGV[o + 1], ARGV[o + 2]
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'status', 'attempt', 'worker', 'prio', 'retries', 'maxr',
    'intr', 'cancel', 'flow', 'name', 'grp')
  local live = true
  if unknown and not r[8] then
    local seen = tonumber(redis.call('HGET', KEYS[20], r[10] or '') or '')
    live = seen ~= nil and now - seen <= grace
  end
  local fence = run_fence(r, attempt, worker, KEYS[14])
  if fence == 'run' and not live then
    out[#out + 1] = 'unknown'
  elseif fence == 'run' then
    local s = KEYS[stream_index(r[4])]
    drop_entry(s, group, eid)
    limit_release(KEYS[17], base, KEYS, rk, tid)
    if r[11] then group_end(group_base(base), KEYS, r[11], 1) end
    local intr = tonumber(r[7] or '0')
    if interrupted and not r[8] then
      intr = intr + 1
      redis.call('HSET', rk, 'intr', intr)
    end
    if r[8] then
      out[#out + 1] = end_cancelled(k, rk, tid, attempt, r[8],
        interrupted and 'interrupted by worker shutdown' or 'not started')
    elseif unknown then
      redis.call('HSET', rk, 'status', 'scheduled', 'due', now + delay)
      redis.call('HDEL', rk, 'eid')
      redis.call('ZADD', KEYS[11], now + delay, tid)
      emit(KEYS[13], maxlen, 'requeued', tid, attempt, worker, 'task name unknown here')
      out[#out + 1] = 'scheduled'
    elseif intr <= max_intr then
      redis.call('HSET', rk, 'status', 'queued')
      group_requeue(KEYS, base, rk, tid, r[4], r[11])  -- its stream, or its group's turn
      emit(KEYS[13], maxlen, 'requeued', tid, attempt, worker,
        interrupted and 'interrupted' or 'not started')
      out[#out + 1] = 'queued'
    else
      local err = 'interrupted by worker shutdown ' .. intr .. ' times'
      out[#out + 1] = spend_retry(k, rk, tid, attempt, r[5], r[6], true, delay, err)
    end
    local res = out[#out]
    if r[9] and (res == 'failed' or res == 'cancelled') then
      flow_note({streams = KEYS, sched = KEYS[11], events = KEYS[13], tbase = base,
        fbase = KEYS[18], flowq = KEYS[19], maxlen = maxlen, ttl = ttl,
        done_prefix = done_prefix}, r[9], res, redis.call('HGET', rk, 'error') or res)
    end
  elseif fence == 'replay' then
    out[#out + 1] = r[1]  -- (see above)
  else
    out[#out + 1] = 'stale'
  end
end
return out
