-- _replay.lua: included by the state-changing scripts an SDK client re-sends after a
-- connection blip (cancel.lua, dlq_requeue.lua). Not a script of its own: a script with the
-- line "-- include: _replay" gets it prepended (dtq/scripts/runner.py). Returns: replayed() the kept
-- reply or nil; keep_reply() its reply argument.
--
-- The caller passes a key named by a nonce of its own call (P:{q}:reply:<nonce>; made once per
-- SDK call, the same in every re-send of it). The first run keeps its reply there for a while;
-- a re-send finds it and gets the same answer, changing nothing. Without it a cancel re-sent
-- after its reply was lost answered "unchanged" (cancel() returned False for a task it had
-- cancelled), and a retry re-sent answered Conflict for a task it had requeued.

-- The reply kept for this call, or nil (also when the caller sent no nonce: reply_key nil).
local function replayed(reply_key)
  if not reply_key then return nil end
  local kept = redis.call('GET', reply_key)
  if kept then return cjson.decode(kept) end
  return nil
end

-- Keep reply for a re-send of this call for ttl_ms (text); returns reply.
local function keep_reply(reply_key, ttl_ms, reply)
  if reply_key then redis.call('SET', reply_key, cjson.encode(reply), 'PX', ttl_ms) end
  return reply
end
