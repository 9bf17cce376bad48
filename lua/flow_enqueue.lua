-- flow_enqueue.lua: create a workflow and start its first steps, atomically (docs/workflows.md).
--
-- Runs on the flow's home queue (the queue of its first step). The flow's state hash is
-- written whole, then every step that waits for nothing is created: here when it lives on the
-- home queue, else as a "put" handover in this queue's outbox (P:{home}:flowq), which the
-- client moves at once with flow_put.lua and a worker moves again if the client did not
-- (flow_put creates a record only once). Waiting steps keep their spec in the flow hash.
-- A flow hash that exists already was made by this very call (the ftid is random and made per
-- enqueue): a re-send after a lost reply. It is answered with the flow's status; nothing is
-- written again.
--
-- KEYS[1..10]  home queue's priority streams p9..p0
-- KEYS[11]     P:{home}:sched, KEYS[12] P:{home}:events, KEYS[13] P:{home}:t:,
-- KEYS[14]     P:{home}:f:, KEYS[15] P:{home}:flowq
-- ARGV[1]      events maxlen, ARGV[2] ftid, ARGV[3] n (steps), ARGV[4] root expression,
-- ARGV[5]      tree (JSON, for display), ARGV[6] the most bytes a released step's arguments
--              may have (DTQ_MAX_PAYLOAD_BYTES; kept as the flow's field maxp)
-- ARGV[7..]    per step, 5 fields: task id (queue:tid), waits (number of steps it waits for),
--              dependents ("3,4" or ''), input expression ('' = none), spec (JSON, see
--              includes/flow_create_step.lua)
-- Returns      {status, created (1 | 0: a re-send)}
-- include: flow_create_step
-- include: flow_event
-- include: now_ms

local K = {streams = KEYS, sched = KEYS[11], events = KEYS[12], tbase = KEYS[13],
  fbase = KEYS[14], flowq = KEYS[15], maxlen = tonumber(ARGV[1])}
local ftid, n = ARGV[2], tonumber(ARGV[3])
local fkey = K.fbase .. ftid
local st = redis.call('HGET', fkey, 'status')
if st then return {st, 0} end
local _, nows = now_ms()
redis.call('HSET', fkey, 'status', 'running', 'n', n, 'left', n, 'nfail', '0', 'root', ARGV[4],
  'tree', ARGV[5], 'enq', nows, 'maxp', ARGV[6])
local h = {}
local function flush()
  if #h > 0 then redis.call('HSET', fkey, unpack(h)); h = {} end
end
for i = 0, n - 1 do
  local o = 7 + i * 5
  local si = tostring(i)
  h[#h + 1] = 'q' .. si; h[#h + 1] = ARGV[o]
  if ARGV[o + 2] ~= '' then h[#h + 1] = 'd' .. si; h[#h + 1] = ARGV[o + 2] end
  if ARGV[o + 1] ~= '0' then
    h[#h + 1] = 'w' .. si; h[#h + 1] = ARGV[o + 1]
    h[#h + 1] = 'x' .. si; h[#h + 1] = ARGV[o + 4]
    if ARGV[o + 3] ~= '' then h[#h + 1] = 'in' .. si; h[#h + 1] = ARGV[o + 3] end
  end
  if #h >= 4000 then flush() end  -- (unpack takes at most ~8000 values)
end
flush()
for i = 0, n - 1 do
  local o = 7 + i * 5
  if ARGV[o + 1] == '0' then
    local spec = cjson.decode(ARGV[o + 4])
    if spec[13] == K.tbase then
      flow_create_step(K, spec, spec[4])
    else
      redis.call('XADD', K.flowq, '*', 'k', 'put', 'spec', ARGV[o + 4], 'args', spec[4])
    end
  end
end
flow_event(K, 'flow_enqueued', ftid, tostring(n) .. ' steps')
return {'running', 1}
