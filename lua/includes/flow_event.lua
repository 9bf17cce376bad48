local function flow_event(K, etype, ftid, detail)
  if K.maxlen > 0 then
    redis.call('XADD', K.events, 'MAXLEN', '~', string.format('%d', K.maxlen), '*',
      'type', etype, 'tid', ftid, 'attempt', '', 'worker', '', 'detail', detail or '',
      'flow', ftid)
  end
end
