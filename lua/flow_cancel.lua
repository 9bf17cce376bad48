-- flow_cancel.lua: cancel a workflow (docs/workflows.md).
--
-- Ends a running or failed flow "cancelled": no waiting step is released after this (the
-- joins release only while the flow runs). Returns the task ids of the released steps that
-- have not ended, for the caller to cancel each on its own queue (cancel.lua: queued ones end
-- cancelled, running ones are asked to stop).
--
-- KEYS[1]      P:{home}:f:<ftid>, KEYS[2] P:{home}:events
-- ARGV[1]      reason, ARGV[2] TTL (s), ARGV[3] done channel of the flow, ARGV[4] events maxlen
-- KEYS[3]      P:{home}:reply:<nonce> (optional): this call's kept reply, for its re-send
-- ARGV[5]      how long the reply is kept for a re-send (ms; with KEYS[3])
-- Returns      {status before ('' = no such flow), task ids...}
--              A re-send of a call (same nonce) gets the first send's reply and changes nothing
--              (see includes/replayed.lua): a cancel whose reply was lost still reports it cancelled.
--
-- include: done_pub
-- include: emit
-- include: keep_reply
-- include: now_ms
-- include: replayed

local fkey, reply_key = KEYS[1], KEYS[3]
local again = replayed(reply_key)
if again then return again end
local st = redis.call('HGET', fkey, 'status')
if not st then return {''} end
local out = {st}
if st == 'running' or st == 'failed' then
  local _, nows = now_ms()
  redis.call('HSET', fkey, 'status', 'cancelled', 'finished', nows, 'error', ARGV[1])
  redis.call('EXPIRE', fkey, ARGV[2])
  redis.call(done_pub(), ARGV[3], 'cancelled')
  local maxlen = tonumber(ARGV[4])
  local ftid = string.match(fkey, ':f:(.*)$')
  emit(KEYS[2], maxlen, 'flow_cancelled', ftid, '', '', ARGV[1])
end
local n = tonumber(redis.call('HGET', fkey, 'n'))
for i = 0, n - 1 do
  local f = redis.call('HMGET', fkey, 'q' .. i, 'x' .. i, 'r' .. i, 'e' .. i)
  if not f[2] and not f[3] and not f[4] then out[#out + 1] = f[1] end
end
return keep_reply(reply_key, ARGV[5], out)
