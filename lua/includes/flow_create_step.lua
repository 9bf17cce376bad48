-- include: flow_public
-- include: group_requeue
-- include: now_ms
-- include: record_defaults
-- Create the task record of a step from its spec (JSON array of 16 strings: queue, tid, name,
-- args, kwargs, prio, maxr, timeout, delay_ms, expires_ms, meta, flow field, task key prefix of
-- its queue, middleware headers (JSON or ''), fair group ('' = none; field grp), dflt (as
-- enqueue.lua's option: what was left to the worker's declaration, '' = none)) with its final
-- args. Nothing when it exists already (a second move of the same handover). Returns 1 when it
-- created it.
local function flow_create_step(K, spec, args)
  local tid, prio = spec[2], spec[6]
  local rk = K.tbase .. tid
  if redis.call('EXISTS', rk) == 1 then return 0 end
  local now, nows = now_ms()
  local delay, status, wk, wv = tonumber(spec[9]), 'queued', nil, nil
  if delay > 0 then
    status, wk, wv = 'scheduled', 'due', string.format('%d', now + delay)
    redis.call('ZADD', K.sched, wv, tid)
  else
    wk, wv = 'status', 'queued'  -- its entry (or its group's list) once the record exists
  end
  local maxr, h = spec[7], {}
  if spec[16] ~= '' then h = {'dflt', spec[16]} end
  if spec[5] ~= '' then h[#h + 1] = 'kwargs'; h[#h + 1] = spec[5] end
  if spec[8] ~= '' then h[#h + 1] = 'timeout'; h[#h + 1] = spec[8] end
  local expires = tonumber(spec[10])
  if expires > 0 then h[#h + 1] = 'exp'; h[#h + 1] = string.format('%d', now + expires) end
  if spec[11] ~= '' then h[#h + 1] = 'meta'; h[#h + 1] = spec[11] end
  if spec[14] ~= '' then h[#h + 1] = 'hdr'; h[#h + 1] = spec[14] end
  if spec[15] ~= '' then h[#h + 1] = 'grp'; h[#h + 1] = spec[15] end
  if prio ~= DEF_PRIO then h[#h + 1] = 'prio'; h[#h + 1] = prio end
  if maxr ~= DEF_MAXR then h[#h + 1] = 'maxr'; h[#h + 1] = maxr end
  redis.call('HSET', rk, 'name', spec[3], 'args', args, 'enq', nows, 'status', status, wk, wv,
    'flow', spec[12], unpack(h))
  if status == 'queued' then
    group_requeue(K.streams, K.tbase, rk, tid, prio, redis.call('HGET', rk, 'grp'))
  end
  if K.maxlen > 0 then
    local flow_id = flow_public(spec[12])
    redis.call('XADD', K.events, 'MAXLEN', '~', string.format('%d', K.maxlen), '*',
      'type', 'enqueued', 'tid', tid, 'attempt', '0', 'worker', '', 'detail', status,
      'flow', flow_id)
  end
  return 1
end
