-- _flow.lua: the workflow transitions (docs/workflows.md), shared by complete.lua, fail.lua
-- and the flow_*.lua scripts through "-- include: _flow". Not a script of its own.
--
-- A flow's state is one hash under its HOME queue's tag: P:{home}:f:<ftid>. Its fields:
--   status (running | succeeded | failed | cancelled), n, left (steps not yet succeeded),
--   nfail (failed steps not yet made good), root (result expression), tree (JSON for display),
--   enq, finished, result, error; per step i: q<i> its task id; w<i> steps it still waits
--   for; d<i> the steps waiting for it ("3,4"); in<i> its input expression; x<i> its spec
--   while it is not released; r<i> its result once it succeeded; e<i> its error while failed.
-- An expression is JSON of step indices ("7", "[1,[2,3]]"): replacing each index by that
-- step's stored result JSON gives the value, with no decoding of user data.
--
-- A step's task record names its flow in the field "flow" = "<flow key>|<i>". When the step
-- ends, the script that ended it calls flow_note(): if the flow lives in the script's own slot
-- (its key starts with this queue's f: prefix) the join runs right there (flow_apply);
-- otherwise the note goes to this queue's outbox stream P:{q}:flowq, in the same script as the
-- outcome, and a worker moves it to the home slot with flow_apply.lua. A released step on
-- another queue's slot goes the same way ("put" entries, flow_put.lua). Both moves are
-- idempotent: flow_apply counts a step once (r<i> / e<i> are set once), flow_put creates a
-- record only if none exists (its tid was fixed when the flow was enqueued).
--
-- Everything sits inside flow_lib(), which returns the functions: a script that includes
-- this file makes one closure per call (complete.lua: a plain task's outcome costs no more),
-- the rest only when a flow is touched.
--
-- K = {streams (index -> stream, p9..p0 at 1..10), sched, events, tbase, fbase, flowq, maxlen,
-- ttl (s, text or number), done_prefix} of the queue the script runs on.

local function flow_lib()
  -- The public flow id ("<home queue>:<ftid>") and step index of a record's flow field.
  local function flow_public(fl)
    local home, ftid, i = string.match(fl, ':([%w_%.%-]+)}:f:([^|]+)|(%d+)$')
    return (home or '?') .. ':' .. (ftid or '?'), i or '?'
  end

  -- The detail of a step's outcome event: "flow <flow id> step <i>".
  local function flow_detail(fl)
    local id, i = flow_public(fl)
    return 'flow ' .. id .. ' step ' .. i
  end

  -- Create the task record of a step from its spec (JSON array of strings: queue, tid, name,
  -- args, kwargs, prio, maxr (as enqueue.lua's field), timeout, delay_ms, expires_ms, meta,
  -- flow field, task key prefix of its queue, middleware headers (JSON or ''), fair group ('' or
  -- absent: none; field grp)) with its final args. Nothing when it exists
  -- already (a second move of the same handover). Returns 1 when it created it.
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
    if string.byte(maxr) == 126 then
      local dflt
      dflt, maxr = string.match(maxr, '^~(%l+)(%d+)$')
      h = {'dflt', dflt}
    end
    if spec[5] ~= '' then h[#h + 1] = 'kwargs'; h[#h + 1] = spec[5] end
    if spec[8] ~= '' then h[#h + 1] = 'timeout'; h[#h + 1] = spec[8] end
    local expires = tonumber(spec[10])
    if expires > 0 then h[#h + 1] = 'exp'; h[#h + 1] = string.format('%d', now + expires) end
    if spec[11] ~= '' then h[#h + 1] = 'meta'; h[#h + 1] = spec[11] end
    if spec[14] and spec[14] ~= '' then h[#h + 1] = 'hdr'; h[#h + 1] = spec[14] end
    if spec[15] and spec[15] ~= '' then h[#h + 1] = 'grp'; h[#h + 1] = spec[15] end
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

  -- The value of expression expr: each step index replaced by that step's result JSON.
  local function flow_value(fkey, expr)
    return (string.gsub(expr, '%d+', function(m) return redis.call('HGET', fkey, 'r' .. m) end))
  end

  local function flow_event(K, etype, ftid, detail)
    if K.maxlen > 0 then
      redis.call('XADD', K.events, 'MAXLEN', '~', string.format('%d', K.maxlen), '*',
        'type', etype, 'tid', ftid, 'attempt', '', 'worker', '', 'detail', detail or '',
        'flow', ftid)
    end
  end

  -- End the running flow at fkey "failed" (or "cancelled") with error text err.
  local function flow_end(K, fkey, nfs, err, detail)
    local ftid = string.sub(fkey, #K.fbase + 1)
    local _, nows = now_ms()
    redis.call('HSET', fkey, 'status', nfs, 'finished', nows, 'error', err)
    redis.call('EXPIRE', fkey, K.ttl)
    redis.call(done_pub(), K.done_prefix .. ftid, nfs)
    flow_event(K, 'flow_' .. nfs, ftid, detail)
  end

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

  -- A step whose record carries flow field fl ended (status, payload): apply it here when the
  -- flow lives in this slot, else hand the note to the home slot through this queue's outbox.
  local function flow_note(K, fl, status, payload)
    local fkey, i = string.match(fl, '^(.*)|(%d+)$')
    if string.sub(fkey, 1, #K.fbase) == K.fbase then
      flow_apply(K, fkey, string.sub(fkey, #K.fbase + 1), i, status, payload)
    else
      redis.call('XADD', K.flowq, '*', 'k', 'note', 'f', fl, 's', status, 'p', payload)
    end
  end
  return {create_step = flow_create_step, apply = flow_apply, note = flow_note,
    release = flow_release, event = flow_event, detail = flow_detail}
end
