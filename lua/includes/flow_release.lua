-- include: flow_create_step
-- include: flow_end
-- include: flow_value
-- Release step j of the flow at fkey (all it waits for succeeded): build its args (its input's
-- value first) and create its record here, or hand it to its own queue's slot. Arguments
-- over the flow's payload limit (maxp, DTQ_MAX_PAYLOAD_BYTES of the enqueueing client) make
-- no task: the step counts as failed (e<j>, for good: it has no record to requeue) and the
-- flow fails. Returns true when it failed the flow so.
local function flow_release(K, fkey, j)
  local x = redis.call('HMGET', fkey, 'x' .. j, 'in' .. j, 'e' .. j, 'maxp')
  if not x[1] or x[3] then return false end  -- released (or refused) before
  local spec = cjson.decode(x[1])
  local args = spec[4]
  if x[2] then
    local input = flow_value(fkey, x[2])
    if args == '[]' then args = '[' .. input .. ']'
    else args = '[' .. input .. ',' .. string.sub(args, 2) end
  end
  local size = #args + #spec[5]
  if x[4] and size > tonumber(x[4]) then
    local err = string.format('arguments are %d bytes, over DTQ_MAX_PAYLOAD_BYTES=%s '
      .. '(pass big results by reference)', size, x[4])
    redis.call('HSET', fkey, 'e' .. j, err)
    redis.call('HDEL', fkey, 'in' .. j)
    redis.call('HINCRBY', fkey, 'nfail', 1)
    if redis.call('HGET', fkey, 'status') == 'running' then
      local q = redis.call('HGET', fkey, 'q' .. j)
      flow_end(K, fkey, 'failed', 'step ' .. j .. ' (' .. q .. ') failed: ' .. err, 'step ' .. j)
    end
    return true
  end
  if spec[13] == K.tbase then
    flow_create_step(K, spec, args)
  else
    redis.call('XADD', K.flowq, '*', 'k', 'put', 'spec', x[1], 'args', args)
  end
  redis.call('HDEL', fkey, 'x' .. j, 'in' .. j)
  return false
end
