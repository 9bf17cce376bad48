-- include: done_pub
-- Mark a task terminal: expire its record (and idempotency key) and wake result() waiters.
-- now (ms) and ttl (s) may be numbers or their text.
local function finish(rk, status, now, ttl, done_channel, idem_base)
  redis.call('HSET', rk, 'status', status, 'finished', now)
  redis.call('EXPIRE', rk, ttl)
  local idem = redis.call('HGET', rk, 'idem')
  if idem and string.sub(idem, 1, 3) == '~u:' then
    -- A unique task's key (dtq/requests.py unique_key) is released as soon as the task ends.
    if redis.call('GET', idem_base .. idem) == string.match(rk, '[^:]+$') then
      redis.call('DEL', idem_base .. idem)
    end
  elseif idem and idem ~= '' then
    redis.call('EXPIRE', idem_base .. idem, ttl)
  end
  redis.call(done_pub(), done_channel, status)
end
