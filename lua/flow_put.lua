-- flow_put.lua: create a released workflow step on its own queue (docs/workflows.md).
--
-- A worker (or the enqueueing client, for a flow's first steps) moves a "put" handover from
-- the home queue's outbox to the step's queue with this script. The step's tid was fixed when
-- the flow was enqueued, so a record that exists already is this very step: nothing is written
-- again (exactly once by construction). The record expires DTQ_RESULT_TTL_S after the step
-- ends, while the put's outbox entry may be moved again later (a worker of the home queue that
-- comes after that, a mover killed before its XACK and taken over): the put marker KEYS[14],
-- written here (or by flow_tomb.lua for a flow cancelled first) without a TTL, says the put
-- was delivered; the mover gives it a TTL only once the entry is acknowledged.
--
-- KEYS[1..10]  the step queue's priority streams p9..p0
-- KEYS[11]     P:{q}:sched, KEYS[12] P:{q}:events, KEYS[13] P:{q}:t:
-- KEYS[14]     P:{q}:fput:<tid> (the step's put marker)
-- ARGV[1]      events maxlen, ARGV[2] spec (JSON, see includes/flow_create_step.lua),
-- ARGV[3]      the step's args (JSON, its input first)
-- Returns      1 created, 0 it existed already (or was delivered before, or cancelled)
-- include: flow_create_step

if redis.call('EXISTS', KEYS[14]) == 1 then return 0 end
redis.call('SET', KEYS[14], 'put')
local K = {streams = KEYS, sched = KEYS[11], events = KEYS[12], tbase = KEYS[13],
  maxlen = tonumber(ARGV[1])}
return flow_create_step(K, cjson.decode(ARGV[2]), ARGV[3])
