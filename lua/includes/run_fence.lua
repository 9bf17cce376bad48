-- The fence of a run's write (complete.lua, fail.lua, requeue.lua, touch.lua): whether the run
-- that writes still holds its task. A stale writer (its run was reclaimed, cancelled or
-- requeued) must touch nothing: the task belongs to someone else.
-- r: the record's status, attempt and worker (r[1..3], as HMGET read them); attempt, worker:
-- the writer's run; stats: P:{q}:stats, where a stale write is counted (nil: not counted);
-- done: the status a write that landed left (nil: any but running).
-- Returns 'run': the record runs this attempt on this worker, the write goes ahead;
-- 'replay': it names this attempt and worker and holds done, so this is a re-send of a write
-- that landed (its reply was lost): answered as the first send was, writing nothing again;
-- 'stale': anything else (counted in stats.stale_writes).
local function run_fence(r, attempt, worker, stats, done)
  if r[2] == attempt and r[3] == worker and r[1] then
    if r[1] == 'running' then return 'run' end
    if done == nil or r[1] == done then return 'replay' end
  end
  if stats then redis.call('HINCRBY', stats, 'stale_writes', '1') end
  return 'stale'
end
