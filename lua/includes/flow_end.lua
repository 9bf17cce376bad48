-- include: done_pub
-- include: flow_event
-- include: now_ms
-- End the running flow at fkey "failed" (or "cancelled") with error text err.
local function flow_end(K, fkey, nfs, err, detail)
  local ftid = string.sub(fkey, #K.fbase + 1)
  local _, nows = now_ms()
  redis.call('HSET', fkey, 'status', nfs, 'finished', nows, 'error', err)
  redis.call('EXPIRE', fkey, K.ttl)
  redis.call(done_pub(), K.done_prefix .. ftid, nfs)
  flow_event(K, 'flow_' .. nfs, ftid, detail)
end
