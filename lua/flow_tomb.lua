-- flow_tomb.lua: mark a workflow step that was never created as cancelled (docs/workflows.md).
--
-- A cancelled flow's released step may still sit in an outbox on its way to its queue (a
-- cross-slot "put" not yet moved). The cancelling client writes the step's record here as
-- "cancelled" when none exists: flow_put.lua then finds it and creates nothing, so the step
-- never runs. An existing record (the step was created meanwhile) is left alone (the caller
-- cancels it as a task).
--
-- KEYS[1]      P:{q}:t:<tid>  (the step's record)
-- ARGV[1]      reason, ARGV[2] record TTL (s)
-- Returns      1 written, 0 the record exists

if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local _, nows = now_ms()
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'error', ARGV[1], 'finished', nows,
  'enq', nows, 'name', '', 'args', '[]', 'prio', '5', 'maxr', '0', 'attempt', '0',
  'retries', '0', 'intr', '0')
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
