-- The replay of a state-changing call an SDK client re-sends after a connection blip (cancel,
-- dlq_requeue, dlq_discard, purge, flow_cancel; docs/faults.md). The caller passes a key named by
-- a nonce of its own call (P:{q}:reply:<nonce>; made once per SDK call, the same in every
-- re-send of it). The first run keeps its reply there for a while (keep_reply); a re-send finds
-- it and gets the same answer, changing nothing. Without it a cancel re-sent after its reply was
-- lost answered "unchanged" (cancel() returned False for a task it had cancelled), and a retry
-- re-sent answered Conflict for a task it had requeued.
--
-- The reply kept for this call, or nil (also when the caller sent no nonce: reply_key nil).
local function replayed(reply_key)
  if not reply_key then return nil end
  local kept = redis.call('GET', reply_key)
  if kept then return cjson.decode(kept) end
  return nil
end
