-- _common.lua: helpers prepended to every dtq script when it is loaded (see dtq/scripts.py).
-- Not a script of its own. Times are Redis server milliseconds, so worker clocks never matter.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Append a lifecycle event to the queue's capped event stream (maxlen 0 disables events).
local function emit(events_key, maxlen, etype, tid, attempt, worker, detail)
  if maxlen > 0 then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
      'type', etype, 'tid', tid, 'attempt', attempt or '', 'worker', worker or '',
      'detail', detail or '')
  end
end

-- Streams are passed as KEYS[1..10] for priorities 9..0.
local function stream_index(prio)
  return 10 - tonumber(prio)
end

-- Remove a delivered entry from the stream and its group's pending list.
local function drop_entry(stream_key, group, eid)
  redis.call('XACK', stream_key, group, eid)
  redis.call('XDEL', stream_key, eid)
end

-- Mark a task terminal: expire its record (and idempotency key) and wake result() waiters.
local function finish(rk, status, now, ttl, done_channel, idem_base)
  redis.call('HSET', rk, 'status', status, 'finished', now)
  redis.call('EXPIRE', rk, ttl)
  local idem = redis.call('HGET', rk, 'idem')
  if idem and idem ~= '' then
    redis.call('EXPIRE', idem_base .. idem, ttl)
  end
  redis.call('PUBLISH', done_channel, status)
end
