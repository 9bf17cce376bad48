-- include: flow_apply
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
