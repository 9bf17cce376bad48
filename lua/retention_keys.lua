-- retention_keys.lua: safety net over keys of one queue found by the retention's SCAN.
--
-- An idempotency key without a TTL whose task record is gone (e.g. purged) is deleted; a task
-- record in a terminal state without a TTL (e.g. written by an older version) gets one.
--
-- KEYS[1]  P:{q}:t:     (task record key prefix)
-- KEYS[2]  P:{q}:idem:  (idempotency key prefix)
-- KEYS[3..] the keys to check (records or idempotency keys of this queue)
-- ARGV[1]  TTL in seconds for terminal records
-- Returns  {idempotency keys deleted, records given a TTL}
-- include: nkeys

local base, idem_base, ttl = KEYS[1], KEYS[2], tonumber(ARGV[1])
local terminal = {succeeded = true, failed = true, cancelled = true, expired = true}
local idem_deleted, expired = 0, 0
for i = 3, nkeys() do
  local k = KEYS[i]
  if redis.call('TTL', k) == -1 then
    if string.sub(k, 1, #idem_base) == idem_base then
      local tid = redis.call('GET', k)
      if tid and redis.call('EXISTS', base .. tid) == 0 then
        redis.call('DEL', k)
        idem_deleted = idem_deleted + 1
      end
    elseif string.sub(k, 1, #base) == base then
      local status = redis.call('HGET', k, 'status')
      if status and terminal[status] then
        redis.call('EXPIRE', k, ttl)
        expired = expired + 1
      end
    end
  end
end
return {idem_deleted, expired}
