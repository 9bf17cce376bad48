-- flow_put.lua: create a released workflow step on its own queue (docs/workflows.md).
--
-- A worker (or the enqueueing client, for a flow's first steps) moves a "put" handover from
-- the home queue's outbox to the step's queue with this script. The step's tid was fixed when
-- the flow was enqueued, so a record that exists already is this very step: nothing is written
-- again (exactly once by construction).
--
-- KEYS[1..10]  the step queue's priority streams p9..p0
-- KEYS[11]     P:{q}:sched, KEYS[12] P:{q}:events, KEYS[13] P:{q}:t:
-- ARGV[1]      events maxlen, ARGV[2] spec (JSON, see flow_create_step in _flow.lua),
-- ARGV[3]      the step's args (JSON, its input first)
-- Returns      1 created, 0 it existed already
-- include: _flow

local K = {streams = KEYS, sched = KEYS[11], events = KEYS[12], tbase = KEYS[13],
  maxlen = tonumber(ARGV[1])}
return flow_lib().create_step(K, cjson.decode(ARGV[2]), ARGV[3])
