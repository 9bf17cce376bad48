-- include: done_pub
-- include: flow_event
-- include: flow_release
-- include: flow_value
-- include: now_ms
-- Step i of the flow (fkey, ftid; in this slot) ended with status ('succeeded', 'failed',
-- 'cancelled', 'expired') and payload (result JSON, or error text). Counts each step once:
-- a replayed, stale or re-moved note changes nothing. Returns 1 when it changed the flow.
local function flow_apply(K, fkey, ftid, i, status, payload)
  local f = redis.call('HMGET', fkey, 'status', 'r' .. i, 'q' .. i)
  if not f[1] or f[2] then return 0 end  -- flow gone (expired, purged), or counted already
  local fs = f[1]
  if status ~= 'succeeded' then
    if redis.call('HSETNX', fkey, 'e' .. i, payload) == 0 then return 0 end
    redis.call('HINCRBY', fkey, 'nfail', 1)
    if fs == 'running' then
      local nfs = status == 'cancelled' and 'cancelled' or 'failed'
      local _, nows = now_ms()
      redis.call('HSET', fkey, 'status', nfs, 'finished', nows,
        'error', 'step ' .. i .. ' (' .. f[3] .. ') ' .. status .. ': ' .. payload)
      redis.call('EXPIRE', fkey, K.ttl)
      redis.call(done_pub(), K.done_prefix .. ftid, nfs)
      flow_event(K, 'flow_' .. nfs, ftid, 'step ' .. i)
    end
    return 1
  end
  redis.call('HSET', fkey, 'r' .. i, payload)
  local left = redis.call('HINCRBY', fkey, 'left', -1)
  if redis.call('HDEL', fkey, 'e' .. i) == 1 then
    -- A failed step made good (requeued from the dead-letter queue): the flow resumes.
    if redis.call('HINCRBY', fkey, 'nfail', -1) == 0 and fs == 'failed' then
      fs = 'running'
      redis.call('HSET', fkey, 'status', 'running')
      redis.call('HDEL', fkey, 'error', 'finished')
      redis.call('PERSIST', fkey)
      flow_event(K, 'flow_resumed', ftid, 'step ' .. i)
      local held = redis.call('HGET', fkey, 'held')
      if held then
        redis.call('HDEL', fkey, 'held')
        for j in string.gmatch(held, '%d+') do
          if fs == 'running' then
            if flow_release(K, fkey, j) then fs = 'failed' end
          else  -- (failed meanwhile by a step's arguments: the rest stays held)
            local h2 = redis.call('HGET', fkey, 'held')
            redis.call('HSET', fkey, 'held', h2 and (h2 .. ',' .. j) or j)
          end
        end
      end
    end
  end
  local deps = redis.call('HGET', fkey, 'd' .. i)
  if deps then
    for j in string.gmatch(deps, '%d+') do
      if redis.call('HINCRBY', fkey, 'w' .. j, -1) == 0 then
        redis.call('HDEL', fkey, 'w' .. j)
        if fs == 'running' then
          if flow_release(K, fkey, j) then fs = 'failed' end
        elseif fs == 'failed' then  -- held until the failed step is made good
          local held = redis.call('HGET', fkey, 'held')
          redis.call('HSET', fkey, 'held', held and (held .. ',' .. j) or j)
        end
      end
    end
  end
  if left == 0 and fs == 'running' then
    local _, nows = now_ms()
    redis.call('HSET', fkey, 'status', 'succeeded', 'finished', nows,
      'result', flow_value(fkey, redis.call('HGET', fkey, 'root')))
    redis.call('EXPIRE', fkey, K.ttl)
    redis.call(done_pub(), K.done_prefix .. ftid, 'succeeded')
    flow_event(K, 'flow_succeeded', ftid, '')
  end
  return 1
end
