-- cancel.lua: cancel a task. Queued and scheduled tasks end "cancelled" at once; a running
-- task gets a durable cancel flag and its worker a pub/sub hint (the worker then stops it and
-- writes "cancelled" through complete.lua). The first cancel wins; a finished task is unchanged.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:sched
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:t:<tid>  (the task record)
-- KEYS[14]     P:{q}:idem:
-- KEYS[15]     P:{q}:reply:<nonce> (optional): this call's kept reply, for its re-send
-- KEYS[16..17] P:{q}:f:, P:{q}:flowq (optional, with KEYS[15]): a workflow step that ends
--              cancelled here cancels its flow in this same call (includes/flow_note.lua)
-- KEYS[18]     P:{q}:lim: (optional, with KEYS[15]): a task released from behind a concurrency
--              limit and cancelled before its run passes its place on (limit_pass_on)
-- ARGV[1]      tid, ARGV[2] events maxlen, ARGV[3] record TTL (s), ARGV[4] done channel,
-- ARGV[5]      cancel hint channel, ARGV[6] reason,
-- ARGV[7]      how long the reply is kept for a re-send (ms; with KEYS[15])
-- Returns      {outcome, status}: outcome 'cancelled' | 'requested' | 'unchanged' | 'missing'
--              A re-send of a call (same nonce) gets the first send's reply and changes nothing
--              (see includes/replayed.lua).
--
-- include: emit
-- include: finish
-- include: flow_note
-- include: group_base
-- include: group_pass
-- include: keep_reply
-- include: limit_pass_on
-- include: now_ms
-- include: replayed
-- include: stream_index

local reply_key = KEYS[15]
local again = replayed(reply_key)
if again then return again end

local function cancel()
  local tid, maxlen, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
  local rk = KEYS[13]
  local r = redis.call('HMGET', rk, 'status', 'eid', 'prio', 'attempt', 'worker', 'cancel', 'flow',
    'lown', 'lk', 'lc', 'grp')
  local status = r[1]
  if not status then return {'missing', ''} end
  local now = now_ms()
  if status == 'queued' then
    -- The entry is not delivered yet (claiming is atomic with delivery): deleting it is enough.
    -- A task parked behind a limit has no entry; the release skips it once it is cancelled.
    if r[2] then redis.call('XDEL', KEYS[stream_index(r[3])], r[2]) end
  elseif status == 'scheduled' then
    redis.call('ZREM', KEYS[11], tid)
  elseif status == 'running' then
    if r[6] then return {'requested', status} end
    redis.call('HSET', rk, 'cancel', ARGV[6])
    redis.call('PUBLISH', ARGV[5], tid)  -- (every worker's channel, no slot's: never SPUBLISH)
    emit(KEYS[12], maxlen, 'cancel_requested', tid, r[4] or '0', r[5], ARGV[6])
    return {'requested', status}
  else
    return {'unchanged', status}
  end
  redis.call('HSET', rk, 'error', ARGV[6])
  redis.call('HDEL', rk, 'eid', 'due', 'lown')
  finish(rk, 'cancelled', now, ttl, ARGV[4], KEYS[14])
  emit(KEYS[12], maxlen, 'cancelled', tid, r[4] or '0', '', ARGV[6])
  local base = string.sub(rk, 1, #rk - #tid)
  if r[8] and KEYS[18] then limit_pass_on(KEYS[18], base, KEYS, r[9], r[10]) end
  -- A queued task of a group: its turn passes on, or it leaves its group's list.
  if r[11] and status == 'queued' then group_pass(group_base(base), KEYS, r[3], r[11], tid) end
  if r[7] and KEYS[17] then
    flow_note({streams = KEYS, sched = KEYS[11], events = KEYS[12], tbase = base,
      fbase = KEYS[16], flowq = KEYS[17], maxlen = maxlen, ttl = ttl,
      done_prefix = string.sub(KEYS[16], 1, -3) .. 'done:'},
      r[7], 'cancelled', ARGV[6])
  end
  return {'cancelled', 'cancelled'}
end

return keep_reply(reply_key, ARGV[7], cancel())
