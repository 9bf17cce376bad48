-- include: emit
-- include: finish
-- include: record_defaults
-- Count a failed attempt of a running task whose fence already passed: retry it later
-- (status "scheduled", due in delay ms) while retry_allowed and its budget allows, else end it
-- "failed" in the dead-letter queue. k = {sched, dlq, events, idem_base, maxlen, ttl,
-- done_prefix, now, worker}. Returns 'scheduled' or 'failed'.
local function spend_retry(k, rk, tid, attempt, retries, maxr, retry_allowed, delay, err)
  retries = tonumber(retries or '0') + 1
  redis.call('HSET', rk, 'retries', retries, 'error', err)
  if retry_allowed and retries <= tonumber(maxr or DEF_MAXR) then
    redis.call('HSET', rk, 'status', 'scheduled', 'due', k.now + delay)
    redis.call('HDEL', rk, 'eid')
    redis.call('ZADD', k.sched, k.now + delay, tid)
    emit(k.events, k.maxlen, 'retried', tid, attempt, k.worker, err)
    return 'scheduled'
  end
  redis.call('ZADD', k.dlq, k.now, tid)
  finish(rk, 'failed', k.now, k.ttl, k.done_prefix .. tid, k.idem_base)
  emit(k.events, k.maxlen, 'failed', tid, attempt, k.worker, err)
  return 'failed'
end
