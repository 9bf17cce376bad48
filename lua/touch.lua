-- touch.lua: the heartbeat's touch of a worker's in-flight entries, checking ownership.
--
-- For each run the worker believes it holds, the entry's idle clock is reset (XCLAIM to itself
-- with idle 0) only if the record still says this worker runs this attempt. Otherwise the run
-- has lost its claim (it was reclaimed while this worker was frozen or cut off) and is reported,
-- and the entry is left alone: the touch never takes an entry back from its new owner.
-- Runs whose task has a cancel request are reported too. A run whose record still names this
-- attempt and worker but is no longer running has stored its own outcome: neither touched nor
-- reported (a reclaim removes the worker field, and a new claim raises the attempt).
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:t:
-- ARGV[1]      group, ARGV[2] worker id, ARGV[3] n
-- ARGV[4..]    per run, 3 fields: tid, eid, attempt
-- Returns      {lost tids..., '|', cancel-requested tids...}
-- include: run_fence
-- include: stream_index

local group, worker, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local base = KEYS[11]
local lost, cancel = {}, {}
for i = 0, n - 1 do
  local o = 4 + i * 3
  local tid, eid, attempt = ARGV[o], ARGV[o + 1], ARGV[o + 2]
  local r = redis.call('HMGET', base .. tid, 'status', 'attempt', 'worker', 'prio', 'cancel')
  local fence = run_fence(r, attempt, worker)  -- (a lost run is not a stale write)
  if fence == 'run' then
    redis.call('XCLAIM', KEYS[stream_index(r[4])], group, worker, 0, eid, 'JUSTID')
    if r[5] then cancel[#cancel + 1] = tid end
  elseif fence == 'replay' then
    -- Not lost: this run's own outcome (or hand-back) landed after the heartbeat listed it.
  else
    lost[#lost + 1] = tid
  end
end
lost[#lost + 1] = '|'
for _, t in ipairs(cancel) do lost[#lost + 1] = t end
return lost
