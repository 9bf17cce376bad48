-- Append a lifecycle event to the queue's capped event stream (maxlen 0 disables events).
-- maxlen is a number; its text is made once per script call, unless events_maxlen gave it.
-- Returns the event's entry id (nil when events are off).
local maxlen_n, maxlen_s = nil, nil
local function emit(events_key, maxlen, etype, tid, attempt, worker, detail)
  if maxlen > 0 then
    if maxlen ~= maxlen_n then maxlen_n, maxlen_s = maxlen, string.format('%d', maxlen) end
    return redis.call('XADD', events_key, 'MAXLEN', '~', maxlen_s, '*',
      'type', etype, 'tid', tid, 'attempt', attempt or '', 'worker', worker or '',
      'detail', detail or '')
  end
end
