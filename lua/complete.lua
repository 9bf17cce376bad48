-- complete.lua: end one or more runs "succeeded" (or "cancelled"), fenced by attempt.
--
-- A run may write its outcome only while the record still says it is running this very
-- attempt on this worker. A stale writer (its run was reclaimed, cancelled or requeued) is
-- rejected, counted in stats.stale_writes, and touches nothing else: the entry then belongs to
-- someone else. A re-send of a write that landed (its reply was lost: the record names this
-- attempt and worker and already holds the status asked for) is answered 1, as the first send
-- was, and writes nothing again (no event, no stale count).
--
-- Then, when ARGV[7] > 0, it claims up to that many new entries exactly as claim.lua does
-- (includes/claim_entries.lua): the worker refills the slots this batch frees in the same
-- round trip. The outcomes are written first, so a run's end and the next start are ordered.
--
-- KEYS[1..19]  as claim.lua: streams p9..p0, paused, events, stats, t:, idem:, sched, lim:
--              (a limited run frees its place, see includes/limit_release.lua), fair, decl
-- KEYS[20]     P:{q}:f: (workflows homed here), KEYS[21] P:{q}:flowq (workflow outbox), as
--              claim.lua: a workflow step's outcome runs its flow's join in this same call
--              (includes/flow_note.lua; a plain task pays one more HMGET field, nothing else)
-- ARGV[1]      group, ARGV[2] worker id, ARGV[3] events maxlen, ARGV[4] record TTL (s),
-- ARGV[5]      done channel prefix, ARGV[6] n
-- ARGV[7]      claim count (0: claim nothing), ARGV[8] 1 = fair mode (see claim.lua)
-- ARGV[9]      the group cap (claim.lua's ARGV[8])
-- ARGV[10..]   per run, 7 fields: tid, eid, attempt, status ('succeeded' | 'cancelled'),
--              payload (the result JSON, or the cancel reason), priority and flags as the
--              run's claim answered them (both empty when not known: see below)
-- ARGV[10+7n]  history TTL (s; 0: no history, and nothing follows; dtq/stats.py); when not 0,
--              then per run (in the same order) its run-time bucket ('': not counted), and
--              KEYS[22] P:{q}:h: (the history's hour keys) is given. The stored outcomes are
--              counted in one BITFIELD (includes/hist_add.lua).
-- Returns      list of n integers: 1 stored (now or by an earlier send of this write),
--              0 rejected (stale); when ARGV[7] > 0 one more
--              element follows: claim.lua's reply
-- include: claim_entries
-- include: done_pub
-- include: emit
-- include: emit_batch
-- include: events_maxlen
-- include: finish
-- include: flow_detail
-- include: flow_note
-- include: group_base
-- include: group_end
-- include: hist_add
-- include: limit_release
-- include: now_ms
-- include: record_defaults
-- include: run_fence
-- include: stream_index

-- Whether stream entry id a ("ms-seq") is below id b. Compared as text, not as numbers
-- (tonumber parses with strtod): ms parts of different lengths decide by length; of the same
-- length, with seq parts of the same length, the text order is the number order; otherwise
-- the ms parts decide, or when equal the shorter seq.
local function id_less(a, b)
  local da, db = string.find(a, '-', 1, true), string.find(b, '-', 1, true)
  if da ~= db then return da < db end
  if #a == #b then return a < b end
  local ma, mb = string.sub(a, 1, da), string.sub(b, 1, db)
  if ma ~= mb then return ma < mb end
  return #a < #b
end

-- Acknowledge ids (entries of this call's runs in one stream) and delete them from the stream.
-- XDEL walks, for each id, its stream node (up to 100 entries) from the start, over the entries
-- deleted before it: at 32 ids a call that was most of the Redis CPU a run's end cost. So when
-- XACK found every id pending, the entries below the lowest one the group still has pending
-- (any worker's), or below the highest of ids when that is lower, go in one XTRIM MINID. Each
-- of them was delivered (entries are delivered in id order, and the highest of ids was) and is
-- pending no more, so it was acknowledged; and every script that acknowledges an entry deletes
-- it in the same call: they are ids, or gone already. The ids above a pending entry (runs that
-- ended out of order) are deleted one by one, as before.
local function ack_and_delete(stream, group, ids)
  if redis.call('XACK', stream, group, unpack(ids)) ~= #ids then
    redis.call('XDEL', stream, unpack(ids))
    return
  end
  local top = ids[1]  -- the highest of ids
  for j = 2, #ids do
    if id_less(top, ids[j]) then top = ids[j] end
  end
  local low = redis.call('XPENDING', stream, group, '-', '+', 1)[1]
  if low then
    low = low[1]
    if id_less(low, top) then
      redis.call('XTRIM', stream, 'MINID', low)
      local above, k = {}, 0
      for _, id in ipairs(ids) do
        if id_less(low, id) then
          k = k + 1
          above[k] = id
        end
      end
      redis.call('XDEL', stream, unpack(above))  -- (not empty: the highest of ids is above)
      return
    end
  end
  local d = string.find(top, '-', 1, true)
  redis.call('XTRIM', stream, 'MINID', string.sub(top, 1, d) ..
    string.format('%d', tonumber(string.sub(top, d + 1)) + 1))
end

local group, worker = ARGV[1], ARGV[2]
local maxlen, ttl_s, done_prefix = events_maxlen(ARGV[3]), ARGV[4], ARGV[5]  -- ttl_s: text
local n = tonumber(ARGV[6])
local pub = n > 0 and done_pub()  -- (found once per call: done_pub)
local claim_count = tonumber(ARGV[7])
local uncapped = (ARGV[9] or '0') == '0'  -- no group cap on this worker (see group_end)
local base = KEYS[14]
-- Without a cap, the ended runs of one fair group that follow one another (a group alone in
-- its band: the whole batch) leave its running count together (group_end).
local end_grp, end_band, end_n = nil, nil, 0
local gb = nil  -- group_base(base), found by the first grouped run
local function end_flush()
  if end_n > 0 then
    gb = gb or group_base(base)
    group_end(gb, KEYS, end_grp, end_n, end_band)
    end_n = 0
  end
end
local now, nows = now_ms()
local out = {}
local acks = {}  -- stream index -> entry ids: acknowledged and deleted once per stream, at the end
-- status -> {tids, attempts} of the outcomes that are not workflow steps: one event entry per
-- status, at the end (includes/emit_batch.lua)
local ended = {}
local hist_ttl = ARGV[10 + n * 7]
if hist_ttl == '0' then hist_ttl = nil end
local hist = {}  -- history slot -> count of this call's stored outcomes
local SLOT = {succeeded = 1, cancelled = 4}
for i = 0, n - 1 do
  local o = 10 + i * 7
  local tid, eid, attempt = ARGV[o], ARGV[o + 1], ARGV[o + 2]
  local status, payload = ARGV[o + 3], ARGV[o + 4]
  local flags = ARGV[o + 6]
  local rk = base .. tid
  -- An absent field costs HMGET a scan of the whole record: with the run's band and flags
  -- from its claim (which of idem, lk, error, flow the record holds; none of them changes
  -- while a run holds the task) the fence reads 3 fields that are there; without, all 8.
  -- (The cancel flag is read on the cancelled path only, for the same reason: most outcomes
  -- are successes.)
  -- (A run of a fair group reads its group with the fence: flag g.)
  local r
  -- (Flags 'g', a grouped run's with nothing else, skip string.find: each costs more than
  -- an HMGET field.)
  local g = flags == 'g' or (flags ~= '' and flags ~= '-' and string.find(flags, 'g', 1, true))
  if flags == '' then
    r = redis.call('HMGET', rk, 'status', 'attempt', 'worker', 'prio', 'idem', 'lk', 'error',
      'flow', 'grp')
  elseif g then
    r = redis.call('HMGET', rk, 'status', 'attempt', 'worker', 'grp')
  else
    r = redis.call('HMGET', rk, 'status', 'attempt', 'worker')
  end
  local fence = run_fence(r, attempt, worker, KEYS[13], status)
  if fence == 'run' then
    if flags ~= '' then
      if g then r[9] = r[4] end
      r[4] = ARGV[o + 5]
      if flags ~= '-' and flags ~= 'g' then
        r[5] = string.find(flags, 'i', 1, true)
        r[6] = string.find(flags, 'l', 1, true)
        r[7] = string.find(flags, 'e', 1, true)
        if string.find(flags, 'f', 1, true) then r[8] = redis.call('HGET', rk, 'flow') end
      end
    end
    local si = stream_index(r[4])
    local ids = acks[si]
    if ids then ids[#ids + 1] = eid else acks[si] = {eid} end
    if r[6] then limit_release(KEYS[17], base, KEYS, rk, tid) end
    if r[9] and not uncapped then
      gb = gb or group_base(base)
      group_end(gb, KEYS, r[9], 1)
    elseif r[9] then
      if r[9] ~= end_grp then
        end_flush()
        end_grp = r[9]
      end
      end_n = end_n + 1
      end_band = r[4] or DEF_PRIO
    end
    local reason = payload  -- what the flow's join is told: the result, or the cancel reason
    if status == 'succeeded' then
      if r[7] then redis.call('HDEL', rk, 'error') end
      if r[5] then
        if payload ~= 'null' then redis.call('HSET', rk, 'result', payload) end
        finish(rk, status, nows, ttl_s, done_prefix .. tid, KEYS[15])
      else
        -- finish() for a task without an idempotency key, in one HSET instead of three calls.
        -- A null result is not stored (absent reads as null: docs/design.md, "The task record").
        if payload == 'null' then
          redis.call('HSET', rk, 'status', status, 'finished', nows)
        else
          redis.call('HSET', rk, 'result', payload, 'status', status, 'finished', nows)
        end
        redis.call('EXPIRE', rk, ttl_s)
        redis.call(pub, done_prefix .. tid, status)
      end
    else
      -- The canceller's reason (the durable cancel flag) wins over the worker's generic one.
      reason = redis.call('HGET', rk, 'cancel') or payload
      redis.call('HSET', rk, 'error', reason)
      finish(rk, status, nows, ttl_s, done_prefix .. tid, KEYS[15])
    end
    if not r[8] then
      local e = ended[status]
      if e then
        e[1][#e[1] + 1] = tid
        e[2][#e[2] + 1] = attempt
      else
        ended[status] = {{tid}, {attempt}}
      end
    else  -- a workflow step: its event names the flow; then the flow's join, in this call
      emit(KEYS[12], maxlen, status, tid, attempt, worker, flow_detail(r[8]))
      flow_note({streams = KEYS, sched = KEYS[16], events = KEYS[12], tbase = base,
        fbase = KEYS[20], flowq = KEYS[21], maxlen = maxlen, ttl = ttl_s,
        done_prefix = done_prefix}, r[8], status, reason)
    end
    if hist_ttl then
      local sl = SLOT[status]
      hist[sl] = (hist[sl] or 0) + 1
      sl = HIST_BUCKET_SLOT[ARGV[11 + n * 7 + i] or '']  -- (nil: not timed)
      if sl then hist[sl] = (hist[sl] or 0) + 1 end
    end
    out[i + 1] = 1
  else
    out[i + 1] = fence == 'replay' and 1 or 0  -- (a replay: see above)
  end
end
for _, st in ipairs({'succeeded', 'cancelled'}) do  -- (a fixed order, not the table's)
  local e = ended[st]
  if e then emit_batch(KEYS[12], maxlen, st, e[1], e[2], worker) end
end
end_flush()
for si, ids in pairs(acks) do ack_and_delete(KEYS[si], group, ids) end
if hist_ttl then hist_add(KEYS[22], hist_ttl, now, hist) end
if claim_count > 0 then
  out[n + 1] = claim_entries(group, worker, claim_count, maxlen, tonumber(ARGV[4]),
    done_prefix, ARGV[8] == '1', tonumber(ARGV[9]), now, nows)
end
return out
