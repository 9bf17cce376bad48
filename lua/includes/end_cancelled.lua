-- include: emit
-- include: finish
-- End a running task "cancelled" because its cancel was requested (the durable flag: reason,
-- its text), on a path that would otherwise move it on (a failure, a hand-back, a reclaim):
-- an acknowledged cancel is never lost. No retry is spent, it does not go to the dead-letter
-- queue; detail (the event's) says what ended the run. k as for spend_retry. Returns 'cancelled'.
local function end_cancelled(k, rk, tid, attempt, reason, detail)
  redis.call('HSET', rk, 'error', reason)
  finish(rk, 'cancelled', k.now, k.ttl, k.done_prefix .. tid, k.idem_base)
  emit(k.events, k.maxlen, 'cancelled', tid, attempt, k.worker, detail)
  return 'cancelled'
end
