-- promote.lua: move due scheduled tasks (delays, retries) into their priority streams.
--
-- The ZSET read, the XADD and the ZREM are one atomic step, so a due task is promoted exactly
-- once even when two schedulers overlap during a leader failover.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:sched
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:t:
-- KEYS[14]     P:{q}:lim:~owed (read only: whether limit_sweep.lua has work)
-- KEYS[15]     P:{q}:schedules:next (read only: when a periodic schedule fires next)
-- ARGV[1]      max tasks to promote in this call, ARGV[2] events maxlen
-- Returns      {promoted, dropped, next_due_ms or -1, owed (1 when KEYS[14] exists, else 0),
--              next_fire_ms or -1 (a disabled schedule, at +inf, is never next), now_ms}
--              The last two spare the scheduler a call of each per queue and tick while there
--              is nothing to sweep or fire (apps/worker/dtq_worker/scheduler.py).
-- include: emit
-- include: group_requeue
-- include: now_ms

local limit, maxlen = tonumber(ARGV[1]), tonumber(ARGV[2])
local base = KEYS[13]
local now = now_ms()
local due = redis.call('ZRANGE', KEYS[11], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local promoted, dropped = 0, 0
for _, tid in ipairs(due) do
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'status', 'prio', 'attempt', 'grp')
  redis.call('ZREM', KEYS[11], tid)
  if r[1] == 'scheduled' then
    redis.call('HSET', rk, 'status', 'queued')
    redis.call('HDEL', rk, 'due')
    group_requeue(KEYS, base, rk, tid, r[2], r[4])  -- its stream, or its group's turn
    emit(KEYS[12], maxlen, 'promoted', tid, r[3] or '0', '', '')
    promoted = promoted + 1
  else
    dropped = dropped + 1
  end
end
local nxt = redis.call('ZRANGE', KEYS[11], 0, 0, 'WITHSCORES')
local next_due = -1
if nxt[2] then next_due = tonumber(nxt[2]) end
local fire = redis.call('ZRANGE', KEYS[15], '-inf', '(inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
local next_fire = -1
if fire[2] then next_fire = tonumber(fire[2]) end
return {promoted, dropped, next_due, redis.call('EXISTS', KEYS[14]), next_fire, now}
