-- dlq_requeue.lua: put finished-unsuccessfully tasks (failed, and for a retry also cancelled or
-- expired) back on their queue, keeping the task id, its record and its history.
--
-- The task gets a new stream entry and status 'queued'; `retries` and `intr` start again at 0
-- (a fresh failure budget), `attempt` keeps counting (it is the fencing token and must never go
-- back), `requeues` counts these requeues, and the last error stays until the next outcome.
-- The record and its idempotency key stop expiring, and the task's expiry deadline (exp) is
-- dropped: a requeue by hand runs the task however late it is. A task that is not in an
-- allowed state (already requeued by a concurrent call, running, succeeded) is left unchanged.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:dlq
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:t:      (task record key prefix)
-- KEYS[14]     P:{q}:idem:
-- ARGV[1]      events maxlen
-- ARGV[2]      new max_retries ('' keeps the task's own; given, it also takes "m" out of the
--              record's dflt: see dtq/declared.py)
-- ARGV[3]      allowed states, comma separated (e.g. 'failed' or 'failed,cancelled,expired')
-- KEYS[15]     P:{q}:reply:<nonce> (optional): this call's kept reply, for its re-send
-- ARGV[4]      n, ARGV[5..] n tids
-- ARGV[5 + n]  how long the reply is kept for a re-send (ms; with KEYS[15])
-- Returns      list of n: 'requeued' | 'missing' | the unchanged task's status
--              A re-send of a call (same nonce) gets the first send's reply and changes nothing
--              (see includes/replayed.lua).
--
-- include: emit
-- include: group_requeue
-- include: keep_reply
-- include: replayed

local maxlen, new_maxr, allowed, n = tonumber(ARGV[1]), ARGV[2], ',' .. ARGV[3] .. ',', tonumber(ARGV[4])
local base, idem_base = KEYS[13], KEYS[14]
local reply_key = KEYS[15]
local again = replayed(reply_key)
if again then return again end
local out = {}
for i = 1, n do
  local tid = ARGV[4 + i]
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'status', 'prio', 'attempt', 'maxr', 'idem', 'dflt', 'grp')
  if not r[1] then
    redis.call('ZREM', KEYS[11], tid)
    out[#out + 1] = 'missing'
  elseif not string.find(allowed, ',' .. r[1] .. ',', 1, true) then
    if r[1] ~= 'failed' then redis.call('ZREM', KEYS[11], tid) end
    out[#out + 1] = r[1]
  else
    redis.call('HSET', rk, 'status', 'queued', 'retries', 0, 'intr', 0)
    group_requeue(KEYS, base, rk, tid, r[2], r[7])  -- its stream, or its group's turn
    -- A requeue by hand means "run it": the task's expiry deadline is dropped, and a
    -- never-claimed task's first claim takes none from its declaration ("e" out of dflt).
    local dflt = r[6] and (string.gsub(r[6], 'e', ''))
    if new_maxr ~= '' then
      redis.call('HSET', rk, 'maxr', new_maxr)
      -- Given now, it overrides the declaration a never-claimed task's first claim would apply.
      if dflt then dflt = (string.gsub(dflt, 'm', '')) end
    end
    if dflt and dflt ~= r[6] then redis.call('HSET', rk, 'dflt', dflt) end
    redis.call('HINCRBY', rk, 'requeues', 1)
    redis.call('HDEL', rk, 'finished', 'result', 'due', 'cancel', 'started', 'exp')
    redis.call('PERSIST', rk)
    if r[5] and r[5] ~= '' then
      local ik = idem_base .. r[5]
      local holder = redis.call('GET', ik)
      if holder == tid then
        redis.call('PERSIST', ik)
      elseif not holder then
        redis.call('SET', ik, tid)
      end
    end
    redis.call('ZREM', KEYS[11], tid)
    emit(KEYS[12], maxlen, 'dlq_requeued', tid, r[3] or '0', '', 'from ' .. r[1])
    out[#out + 1] = 'requeued'
  end
end
return keep_reply(reply_key, ARGV[5 + n], out)
