-- flow_tomb.lua: mark a workflow step that was never created as cancelled (docs/workflows.md).
--
-- A cancelled flow's released step may still sit in an outbox on its way to its queue (a
-- cross-slot "put" not yet moved). The cancelling client writes the step's record here as
-- "cancelled" when none exists, and the step's put marker (see flow_put.lua) without a TTL:
-- flow_put.lua then finds it and creates nothing, so the step never runs, however late the
-- put is moved (the mover gives the marker a TTL once the put's entry is acknowledged). An
-- existing record or marker (the step was created meanwhile) is left alone (the caller
-- cancels it as a task).
--
-- KEYS[1]      P:{q}:t:<tid>  (the step's record), KEYS[2] P:{q}:fput:<tid> (its put marker)
-- ARGV[1]      reason, ARGV[2] record TTL (s)
-- Returns      1 written, 0 the record (or the marker) exists
-- include: now_ms

if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local _, nows = now_ms()
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'error', ARGV[1], 'finished', nows,
  'enq', nows, 'name', '', 'args', '[]', 'maxr', '0')
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], 'cancelled')
return 1
