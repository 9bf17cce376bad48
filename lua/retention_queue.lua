-- retention_queue.lua: whether a queue holds nothing at all, and if asked, delete its empty keys.
--
-- A queue holds nothing when each priority stream is empty with no pending entry and no consumer
-- (consumers of dead workers are pruned after DTQ_DEAD_WORKER_TTL_S), and it has no scheduled
-- task, dead letter, parked task, periodic schedule or pause. Retention forgets such a name from
-- the registry P:queues (a global key in another slot: never touched here) when it held nothing
-- on two passes in a row and no live worker consumes it. Finished task records are left to their
-- TTL (dtq task <id> still finds them).
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:sched
-- KEYS[12]     P:{q}:dlq
-- KEYS[13]     P:{q}:paused
-- KEYS[14]     P:{q}:schedules
-- KEYS[15]     P:{q}:lim:~parked
-- KEYS[16]     P:{q}:events
-- KEYS[17]     P:{q}:stats
-- KEYS[18]     P:{q}:fair
-- KEYS[19]     P:{q}:decl  (the declarations workers published: no worker consumes the queue
--              now, and one that does again publishes them again when it starts)
-- KEYS[20]     P:{q}:flowq (the workflow outbox, docs/workflows.md): empty when it has no
--              entry and nothing pending; its movers' consumers do not count (a stopped
--              worker's stay in its group)
-- KEYS[21]     P:{q}:decl:seen, KEYS[22] P:{q}:schedules:seen (the workers' declaration
--              stamps: as KEYS[19], a worker consuming the queue again writes them again)
-- KEYS[23]     P:{q}:g:idx, KEYS[24] P:{q}:g:paused: an active fair group (waiting or running
--              tasks) or a paused one (docs/groups.md) is something the queue holds
-- ARGV[1]      consumer group, ARGV[2] 1 = delete the empty keys when it holds nothing
-- Returns      1 when the queue holds nothing, else 0

local group, drop = ARGV[1], ARGV[2] == '1'
for i = 1, 10 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('XLEN', KEYS[i]) > 0 then return 0 end
    local groups = redis.call('XINFO', 'GROUPS', KEYS[i])
    for _, g in ipairs(groups) do
      for j = 1, #g, 2 do
        if (g[j] == 'consumers' or g[j] == 'pending') and tonumber(g[j + 1]) > 0 then return 0 end
      end
    end
  end
end
if redis.call('EXISTS', KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15]) > 0 then return 0 end
if KEYS[23] and redis.call('EXISTS', KEYS[23], KEYS[24]) > 0 then return 0 end
if KEYS[20] and redis.call('EXISTS', KEYS[20]) == 1 then
  if redis.call('XLEN', KEYS[20]) > 0 then return 0 end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[20])) do
    for j = 1, #g, 2 do
      if g[j] == 'pending' and tonumber(g[j + 1]) > 0 then return 0 end
    end
  end
end
if drop then redis.call('DEL', unpack(KEYS)) end
return 1
