-- reclaim.lua: adopt entries idle past the visibility timeout (their worker died or froze).
--
-- XAUTOCLAIM and the state change run in one script, so exactly one reclaimer wins an entry.
-- A lost run spends one retry (the run may have had effects); the task goes back to its queue
-- as a new entry, to be claimed like any other (the claim then raises the attempt, which fences
-- out the old run). Past its retry budget it ends "failed" with the reason "worker lost"
-- (a poison pill that kills every worker that runs it). A lost run whose cancel was requested
-- (the durable cancel flag) ends "cancelled" instead: no retry spent, not in the DLQ (an
-- acknowledged cancel is never lost to a frozen or dead worker). Entries whose record is not running that very entry are duplicates: acknowledged and absorbed.
--
-- A pass walks every band's pending list from its start, p9 first. One call does bounded
-- work: at most ARGV[10] XAUTOCLAIM calls, each examining at most 10 x COUNT pending entries
-- (Redis's own bound), and at most ARGV[4] entries adopted in all. It returns where it stopped
-- (band and cursor); the reaper calls again from there until the pass is complete, so a lost
-- run behind any number of live ones is found in the same pass.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:dlq
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:stats
-- KEYS[14]     P:{q}:t:
-- KEYS[15]     P:{q}:idem:
-- KEYS[16]     P:{q}:lim:  (limit key prefix: a lost limited run frees its place)
-- KEYS[17]     P:{q}:f:, KEYS[18] P:{q}:flowq: a workflow step that ends failed or cancelled
--              here fails (cancels) its flow in this same call (includes/flow_note.lua)
-- ARGV[1]      group, ARGV[2] reclaimer's worker id, ARGV[3] min idle ms (visibility timeout),
-- ARGV[4]      max entries to adopt in this call (the COUNT of its XAUTOCLAIMs),
-- ARGV[5]      events maxlen, ARGV[6] record TTL (s) of a failed task, ARGV[7] done channel
--              prefix,
-- ARGV[8]      band to start at (KEYS index 1..10; default 1: a new pass),
-- ARGV[9]      cursor in that band (default '0-0': its start),
-- ARGV[10]     max XAUTOCLAIM calls in this call (default 10)
-- Returns      {requeued, failed, absorbed, next band (0: the pass is complete), next cursor,
--              XAUTOCLAIM calls made, cancelled}
-- include: drop_entry
-- include: emit
-- include: end_cancelled
-- include: finish
-- include: flow_note
-- include: group_base
-- include: group_end
-- include: group_requeue
-- include: limit_release
-- include: now_ms
-- include: record_defaults

local group, worker = ARGV[1], ARGV[2]
local min_idle, left = tonumber(ARGV[3]), tonumber(ARGV[4])
local maxlen, ttl, done_prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local band, cursor = tonumber(ARGV[8] or '1'), ARGV[9] or '0-0'
local steps_max = tonumber(ARGV[10] or '10')
local base = KEYS[14]
local now = now_ms()
local k = {dlq = KEYS[11], events = KEYS[12], idem_base = KEYS[15], maxlen = maxlen, ttl = ttl,
  done_prefix = done_prefix, now = now, worker = worker}
local function note(r8, status, payload)  -- a step of a workflow ended here
  flow_note({streams = KEYS, events = KEYS[12], tbase = base, fbase = KEYS[17],
    flowq = KEYS[18], maxlen = maxlen, ttl = ttl, done_prefix = done_prefix}, r8, status,
    payload)
end
local requeued, failed, absorbed, cancelled, steps = 0, 0, 0, 0, 0
while band <= 10 and steps < steps_max and left > 0 do
  local stream = KEYS[band]
  if redis.call('EXISTS', stream) == 1 then
    steps = steps + 1
    local res = redis.call('XAUTOCLAIM', stream, group, worker, min_idle, cursor, 'COUNT', left)
    cursor = res[1]
    for _, entry in ipairs(res[2]) do
      left = left - 1
      local eid, fields = entry[1], entry[2]
      local tid = fields[2]
      local rk = base .. tid
      local r = redis.call('HMGET', rk, 'status', 'eid', 'attempt', 'worker', 'retries', 'maxr',
        'cancel', 'flow', 'prio', 'grp')
      drop_entry(stream, group, eid)
      if r[1] == 'running' and r[2] == eid then
        limit_release(KEYS[16], base, KEYS, rk, tid)
        if r[10] then group_end(group_base(base), KEYS, r[10], 1) end
        local err = 'worker lost: ' .. (r[4] or '?') .. ' stopped heartbeating during attempt '
          .. r[3]
        redis.call('HDEL', rk, 'worker')  -- the lost worker's touch then reports the loss
        if r[7] then
          end_cancelled(k, rk, tid, r[3], r[7], err)
          cancelled = cancelled + 1
          if r[8] then note(r[8], 'cancelled', r[7]) end
        else
          local retries = tonumber(r[5] or '0') + 1
          redis.call('HSET', rk, 'retries', retries, 'error', err)
          if retries <= tonumber(r[6] or DEF_MAXR) then
            redis.call('HSET', rk, 'status', 'queued')
            group_requeue(KEYS, base, rk, tid, r[9], r[10])  -- its stream, or its group's turn
            emit(KEYS[12], maxlen, 'reclaimed', tid, r[3], worker, err)
            requeued = requeued + 1
          else
            redis.call('ZADD', KEYS[11], now, tid)
            finish(rk, 'failed', now, ttl, done_prefix .. tid, KEYS[15])
            emit(KEYS[12], maxlen, 'failed', tid, r[3], worker, err)
            failed = failed + 1
            if r[8] then note(r[8], 'failed', err) end
          end
        end
      else
        redis.call('HINCRBY', KEYS[13], 'absorbed', '1')
        emit(KEYS[12], maxlen, 'absorbed', tid, r[3] or (r[1] and '0'), worker, eid)
        absorbed = absorbed + 1
      end
    end
    if cursor == '0-0' then band = band + 1 end
  else
    band, cursor = band + 1, '0-0'
  end
end
if band > 10 then band = 0 end
return {requeued, failed, absorbed, band, cursor, steps, cancelled}
