-- fail.lua: store a failed run; schedule its retry or end it "failed" (dead-letter queue).
--
-- Fenced like complete.lua. A re-send of a write that landed (its reply was lost: the record
-- names this attempt and worker and is no longer running) is answered with the record's status
-- and writes nothing again (no event, no retry spent, no stale count). A failure spends one retry; while retries <= max_retries and a
-- retry is allowed, the task goes to the schedule with the given delay, else it ends failed.
-- A run whose cancel was requested (the durable cancel flag) ends "cancelled" instead, whatever
-- its retries: no retry spent, not in the DLQ (its failure is the detail of the event).
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
-- ARGV[1]      group, ARGV[2] worker id, ARGV[3] events maxlen, ARGV[4] record TTL (s) of a
--              failed task, ARGV[5] done channel prefix, ARGV[6] n
-- ARGV[7..]    per run, 5 fields: tid, eid, attempt, error text,
--              retry delay ms ('' = no retry allowed, e.g. dtq.Fail or an unstorable result)
-- ARGV[7+5n..] per run (in the same order) the failure's traceback text, stored in the
--              record's 'tb' field; '' removes a kept one
-- ARGV[7+6n]   history TTL (s; 0: no history, and nothing follows; dtq/stats.py); when not 0,
--              then per run its run-time bucket ('': not counted), and KEYS[20] P:{q}:h: is
--              given. Counted in one BITFIELD (includes/hist_add.lua).
-- Returns      list of n: 'scheduled' | 'failed' | 'cancelled' | 'stale'; for a re-send,
--              the status the record has now ('scheduled', 'failed', 'cancelled', or what
--              followed: 'queued', ...)
-- include: drop_entry
-- include: end_cancelled
-- include: flow_note
-- include: group_base
-- include: group_end
-- include: hist_add
-- include: limit_release
-- include: now_ms
-- include: run_fence
-- include: spend_retry
-- include: stream_index

local group, worker = ARGV[1], ARGV[2]
local maxlen, ttl, done_prefix = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local n = tonumber(ARGV[6])
local base = KEYS[15]
local now = now_ms()
local k = {sched = KEYS[11], dlq = KEYS[12], events = KEYS[13], idem_base = KEYS[16],
  maxlen = maxlen, ttl = ttl, done_prefix = done_prefix, now = now, worker = worker}
local out = {}
local hist_ttl = ARGV[7 + n * 6]
if hist_ttl == '0' then hist_ttl = nil end
local hist = {}  -- history slot -> count of this call's stored outcomes
local SLOT = {failed = 2, scheduled = 3, cancelled = 4}
for i = 0, n - 1 do
  local o = 7 + i * 5
  local tid, eid, attempt, err = ARGV[o], ARGV[o + 1], ARGV[o + 2], ARGV[o + 3]
  local delay = tonumber(ARGV[o + 4])  -- (nil: no retry allowed)
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'status', 'attempt', 'worker', 'prio', 'retries', 'maxr',
    'cancel', 'flow', 'grp')
  local fence = run_fence(r, attempt, worker, KEYS[14])
  if fence == 'run' then
    drop_entry(KEYS[stream_index(r[4])], group, eid)
    limit_release(KEYS[17], base, KEYS, rk, tid)
    if r[9] then group_end(group_base(base), KEYS, r[9], 1) end
    if r[7] then
      out[#out + 1] = end_cancelled(k, rk, tid, attempt, r[7], err)
    else
      out[#out + 1] = spend_retry(k, rk, tid, attempt, r[5], r[6], delay ~= nil, delay or 0, err)
    end
    if hist_ttl then
      local sl = SLOT[out[#out]]
      hist[sl] = (hist[sl] or 0) + 1
      sl = HIST_BUCKET_SLOT[ARGV[8 + n * 6 + i] or '']  -- (nil: not timed)
      if sl then hist[sl] = (hist[sl] or 0) + 1 end
    end
    local tb = ARGV[7 + n * 5 + i]
    if tb == '' then
      redis.call('HDEL', rk, 'tb')
    else
      redis.call('HSET', rk, 'tb', tb)
    end
    if r[8] and out[#out] ~= 'scheduled' then
      flow_note({streams = KEYS, sched = KEYS[11], events = KEYS[13], tbase = base,
        fbase = KEYS[18], flowq = KEYS[19], maxlen = maxlen, ttl = ttl,
        done_prefix = done_prefix}, r[8], out[#out], r[7] or err)
    end
  elseif fence == 'replay' then
    out[#out + 1] = r[1]  -- (see above)
  else
    out[#out + 1] = 'stale'
  end
end
if hist_ttl then hist_add(KEYS[20], hist_ttl, now, hist) end
return out
