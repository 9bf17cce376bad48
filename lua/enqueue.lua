-- enqueue.lua: create one or more tasks (bulk enqueue is one call).
--
-- KEYS[1]      P:{q}:sched   (zset of scheduled tasks, score = due ms)
-- KEYS[2]      P:{q}:events
-- KEYS[3]      P:{q}:t:      (task record key prefix; names the slot)
-- KEYS[4]      P:{q}:idem:   (idempotency key prefix)
-- KEYS[5..]    the priority streams P:{q}:p<band> of the bands this call's tasks go to (only
--              those: a single enqueue names one stream, not ten; each is found by its band
--              digit, the key's last character)
-- ARGV[1]      events maxlen (0 = no events)
-- ARGV[2]      n, the number of tasks
-- ARGV[3..]    per task, 12 fields: tid, name, args(JSON), kwargs(JSON or ''), priority(0-9),
--              max_retries, timeout_s('' = none), delay_ms(0 = now), expires_ms(0 = never,
--              relative to now), idempotency key ('' = none), meta(JSON or ''),
--              limit ('' = none, else "concurrency|rate count|rate window ms|key", dtq/limits.py)
-- Returns      flat list, 3 per task: tid, status, created(1) | existing(0)
--              For an idempotency key that names a live task, that task's tid and status.
--
-- The call's time ("enq", and what delays and expiry count from) is read once: from the first
-- stream entry's id (its milliseconds are the server's clock), or by TIME when a scheduled task
-- comes first (TIME is a call of its own: a tenth of a single enqueue's cost).

local maxlen = events_maxlen(ARGV[1])
local n = tonumber(ARGV[2])
local sched, events, base, idem_base = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local streams = {}
for i = 5, #KEYS do streams[string.sub(KEYS[i], -1)] = KEYS[i] end
local F = 12
for i = 0, n - 1 do  -- before anything is written
  local prio = ARGV[3 + i * F + 4]
  if not streams[prio] then
    return redis.error_reply('DTQ_BAD_CALL no stream key for priority ' .. tostring(prio))
  end
end
local now, nows = nil, nil  -- the call's time: number, and its text for the record
local out = {}
for i = 0, n - 1 do
  local o = 3 + i * F
  local tid, name, args, kwargs = ARGV[o], ARGV[o + 1], ARGV[o + 2], ARGV[o + 3]
  local prio, maxr, timeout = ARGV[o + 4], ARGV[o + 5], ARGV[o + 6]
  local delay, expires, idem, meta = tonumber(ARGV[o + 7]), tonumber(ARGV[o + 8]), ARGV[o + 9], ARGV[o + 10]
  local existing = nil
  if idem ~= '' then
    local prev = redis.call('GET', idem_base .. idem)
    if prev then
      local st = redis.call('HGET', base .. prev, 'status')
      if st then existing = {prev, st} end
    end
  end
  if existing then
    out[#out + 1] = existing[1]
    out[#out + 1] = existing[2]
    out[#out + 1] = 0
  else
    local rk = base .. tid
    if redis.call('EXISTS', rk) == 1 then
      return redis.error_reply('DTQ_DUPLICATE_ID ' .. tid)
    end
    local status, eid
    if delay > 0 then
      status = 'scheduled'
      if not now then now, nows = now_ms() end
    else
      status = 'queued'
      eid = redis.call('XADD', streams[prio], '*', 't', tid)
      if not now then  -- the id's milliseconds (a plain find: cheaper than a pattern)
        nows = string.sub(eid, 1, string.find(eid, '-', 1, true) - 1)
        now = tonumber(nows)
      end
    end
    -- The record is written by one HSET (each redis.call has a cost; see docs/performance.md).
    -- (Built whole by one constructor: appending to it would grow the table once more.)
    local h
    if eid then
      h = {'name', name, 'args', args, 'prio', prio, 'maxr', maxr, 'attempt', '0',
        'retries', '0', 'intr', '0', 'enq', nows, 'status', status, 'eid', eid}
    else
      h = {'name', name, 'args', args, 'prio', prio, 'maxr', maxr, 'attempt', '0',
        'retries', '0', 'intr', '0', 'enq', nows, 'status', status, 'due', now + delay}
      redis.call('ZADD', sched, now + delay, tid)
    end
    if kwargs ~= '' then h[#h + 1] = 'kwargs'; h[#h + 1] = kwargs end
    if timeout ~= '' then h[#h + 1] = 'timeout'; h[#h + 1] = timeout end
    if expires > 0 then h[#h + 1] = 'exp'; h[#h + 1] = now + expires end
    if meta ~= '' then h[#h + 1] = 'meta'; h[#h + 1] = meta end
    local lim = ARGV[o + 11]
    if lim and lim ~= '' then
      local lc, lrn, lrw, lk = string.match(lim, '^(%d+)|(%d+)|(%d+)|(.*)$')
      for _, v in ipairs({'lk', lk, 'lc', lc, 'lrn', lrn, 'lrw', lrw}) do h[#h + 1] = v end
    end
    if idem ~= '' then
      h[#h + 1] = 'idem'; h[#h + 1] = idem
      redis.call('SET', idem_base .. idem, tid)
    end
    redis.call('HSET', rk, unpack(h))
    emit(events, maxlen, 'enqueued', tid, '0', '', status)
    out[#out + 1] = tid
    out[#out + 1] = status
    out[#out + 1] = 1
  end
end
return out
