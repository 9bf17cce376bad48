-- schedule_fire.lua: advance one periodic schedule and enqueue its task, in one atomic step.
--
-- The caller (the scheduler leader of the queue) read the schedule's next fire time EXPECTED
-- and computed the following one. The script moves the schedule only if its next fire time is
-- still EXPECTED and its definition is still SPEC (compare-and-set), so a fire is enqueued
-- exactly once even when two leaders overlap during a failover or a definition just changed.
-- With overlap disallowed, a fire is skipped while the last task of the schedule is still
-- queued, scheduled or running.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:events
-- KEYS[12]     P:{q}:t:              (task record key prefix)
-- KEYS[13]     P:{q}:schedules       (hash name -> definition JSON)
-- KEYS[14]     P:{q}:schedules:next  (zset name -> next fire ms)
-- KEYS[15]     P:{q}:schedules:last  (hash name -> tid of the last fired task)
-- ARGV[1]      schedule name, ARGV[2] expected next fire (ms), ARGV[3] new next fire (ms),
-- ARGV[4]      definition JSON as read by the caller, ARGV[5] fire: 1 enqueue, 0 skip (missed),
-- ARGV[6]      overlap allowed: 1 | 0, ARGV[7] events maxlen, ARGV[8] fire time (ms, for events)
-- ARGV[9..23]  the task, 15 fields: tid, name, args(JSON), kwargs(JSON or ''), priority,
--              max_retries, timeout_s ('' = none), expires_ms (0 = never, relative to now), meta
--              (JSON or ''), its limit's key ('' = none), concurrency, rate count and rate
--              window ms (dtq/limits.py; as enqueue.lua's lk, lc, lrn, lrw), fair group ('' =
--              none; field grp, docs/groups.md), dflt (as enqueue.lua's: what the fire left to
--              the declaration of the worker that runs it, '' = none)
-- Returns      {outcome, tid}: outcome 'fired' | 'overlap' (skipped, previous run active) |
--              'missed' (skipped, past the grace period) | 'stale' (someone else moved it)
-- include: emit
-- include: group_requeue
-- include: now_ms
-- include: record_defaults

local name, expected, nxt = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local maxlen = tonumber(ARGV[7])
local score = redis.call('ZSCORE', KEYS[14], name)
if not score or tonumber(score) ~= expected then return {'stale', ''} end
if redis.call('HGET', KEYS[13], name) ~= ARGV[4] then return {'stale', ''} end
redis.call('ZADD', KEYS[14], nxt, name)
local now = now_ms()
if ARGV[5] ~= '1' then
  emit(KEYS[11], maxlen, 'schedule_missed', '', '', '', name .. ' ' .. ARGV[8])
  return {'missed', ''}
end
if ARGV[6] ~= '1' then
  local last = redis.call('HGET', KEYS[15], name)
  if last then
    local st = redis.call('HGET', KEYS[12] .. last, 'status')
    if st == 'queued' or st == 'scheduled' or st == 'running' then
      emit(KEYS[11], maxlen, 'schedule_skipped', last, '', '', name .. ' ' .. ARGV[8])
      return {'overlap', last}
    end
  end
end
local tid, tname, args, kwargs = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local prio, maxr, timeout, expires, meta = ARGV[13], ARGV[14], ARGV[15], tonumber(ARGV[16]),
  ARGV[17]
local rk = KEYS[12] .. tid
if redis.call('EXISTS', rk) == 1 then
  return redis.error_reply('DTQ_DUPLICATE_ID ' .. tid)
end
redis.call('HSET', rk, 'name', tname, 'args', args, 'enq', now)
if prio ~= DEF_PRIO then redis.call('HSET', rk, 'prio', prio) end
if maxr ~= DEF_MAXR then redis.call('HSET', rk, 'maxr', maxr) end
if kwargs ~= '' then redis.call('HSET', rk, 'kwargs', kwargs) end
if timeout ~= '' then redis.call('HSET', rk, 'timeout', timeout) end
if expires > 0 then redis.call('HSET', rk, 'exp', now + expires) end
if meta ~= '' then redis.call('HSET', rk, 'meta', meta) end
if ARGV[22] ~= '' then redis.call('HSET', rk, 'grp', ARGV[22]) end
if ARGV[23] ~= '' then redis.call('HSET', rk, 'dflt', ARGV[23]) end
if ARGV[18] ~= '' then
  redis.call('HSET', rk, 'lk', ARGV[18], 'lc', ARGV[19], 'lrn', ARGV[20], 'lrw', ARGV[21])
end
redis.call('HSET', rk, 'status', 'queued')
group_requeue(KEYS, KEYS[12], rk, tid, prio, redis.call('HGET', rk, 'grp'))
redis.call('HSET', KEYS[15], name, tid)
emit(KEYS[11], maxlen, 'enqueued', tid, 0, '', 'queued')
emit(KEYS[11], maxlen, 'schedule_fired', tid, 0, '', name .. ' ' .. ARGV[8])
return {'fired', tid}
