-- dlq_discard.lua: delete failed tasks for good: their record, idempotency key and place in the
-- dead-letter queue. A task that is no longer failed (requeued meanwhile) is left unchanged;
-- a dead-letter entry whose record already expired is removed.
--
-- KEYS[1]      P:{q}:dlq
-- KEYS[2]      P:{q}:events
-- KEYS[3]      P:{q}:t:      (task record key prefix)
-- KEYS[4]      P:{q}:idem:
-- ARGV[1]      events maxlen
-- KEYS[5]      P:{q}:reply:<nonce> (optional): this call's kept reply, for its re-send
-- ARGV[2]      n, ARGV[3..] n tids
-- ARGV[3 + n]  how long the reply is kept for a re-send (ms; with KEYS[5])
-- Returns      list of n: 'discarded' | 'missing' (no record and not listed) | the unchanged
--              task's status. A re-send of a call (same nonce) gets the first send's reply and
--              changes nothing (see includes/replayed.lua).
--
-- include: emit
-- include: keep_reply
-- include: replayed

local maxlen, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local base, idem_base = KEYS[3], KEYS[4]
local reply_key = KEYS[5]
local again = replayed(reply_key)
if again then return again end
local out = {}
for i = 1, n do
  local tid = ARGV[2 + i]
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'status', 'idem', 'attempt')
  if r[1] == 'failed' then
    if r[2] and r[2] ~= '' and redis.call('GET', idem_base .. r[2]) == tid then
      redis.call('DEL', idem_base .. r[2])
    end
    redis.call('DEL', rk)
    redis.call('ZREM', KEYS[1], tid)
    emit(KEYS[2], maxlen, 'discarded', tid, r[3] or '0', '', '')
    out[#out + 1] = 'discarded'
  elseif not r[1] then
    if redis.call('ZREM', KEYS[1], tid) == 1 then
      out[#out + 1] = 'discarded'
    else
      out[#out + 1] = 'missing'
    end
  else
    out[#out + 1] = r[1]
  end
end
return keep_reply(reply_key, ARGV[3 + n], out)
