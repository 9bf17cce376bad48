-- flow_apply.lua: the join of a workflow step that ended on another slot (docs/workflows.md).
--
-- A worker moves a "note" from a step queue's outbox (P:{q}:flowq) to the flow's home slot
-- with this script: the same transition complete.lua and fail.lua run in place when the flow
-- shares their slot (includes/flow_apply.lua). Idempotent by (flow, step): a step is counted
-- once however often its note is moved (a mover that died before acknowledging it).
--
-- KEYS[1..10]  home queue's priority streams p9..p0
-- KEYS[11]     P:{home}:sched, KEYS[12] P:{home}:events, KEYS[13] P:{home}:t:,
-- KEYS[14]     P:{home}:f:, KEYS[15] P:{home}:flowq
-- ARGV[1]      events maxlen, ARGV[2] TTL (s) of the flow once it ends, ARGV[3] done channel
--              prefix of the home queue, ARGV[4] ftid, ARGV[5] step index, ARGV[6] status
--              ('succeeded' | 'failed' | 'cancelled' | 'expired'), ARGV[7] payload
-- Returns      1 when the note changed the flow, 0 when it was counted before (or the flow
--              is gone)
-- include: flow_apply

local K = {streams = KEYS, sched = KEYS[11], events = KEYS[12], tbase = KEYS[13],
  fbase = KEYS[14], flowq = KEYS[15], maxlen = tonumber(ARGV[1]), ttl = ARGV[2],
  done_prefix = ARGV[3]}
return flow_apply(K, K.fbase .. ARGV[4], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
