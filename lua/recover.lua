-- recover.lua: find the runs this worker started in Redis but never heard of (a lost reply).
--
-- A claim (claim.lua, or the claim inside complete.lua) whose reply was lost on the way back
-- (the connection dropped after Redis ran it) has marked its runs running under this worker,
-- which never learnt of them. They are pending to this consumer in the group. For each band,
-- this reads the entries pending to this worker (XPENDING ... consumer) that the worker did not
-- list as known, and for each whose record is running this very entry under this worker, renews
-- its lease (XCLAIM to itself, idle 0) and returns it in claim.lua's reply format, to be run (or
-- handed back) by the worker. Such a run keeps its attempt: the claim already counted it, and
-- its body never started anywhere.
-- A run whose record started before ARGV[4] belongs to an earlier process that used this worker
-- id (it may have run): it is left alone, for the reaper. Any other entry pending to this worker
-- that its record does not name (or whose record is gone) is a duplicate: acknowledged, deleted
-- and counted as absorbed, as claim.lua does.
-- The worker sends this only while no claim of this queue is in flight (a claim whose reply is
-- merely slow has runs that look exactly like lost ones).
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:events
-- KEYS[12]     P:{q}:stats
-- KEYS[13]     P:{q}:t:      (task record key prefix)
-- ARGV[1]      consumer group, ARGV[2] worker id (consumer name), ARGV[3] events maxlen
-- ARGV[4]      ms (server time): runs started before it are not this process's
-- ARGV[5]      max pending entries read per band
-- ARGV[6]      n, then ARGV[7..] n known runs, 2 fields each: priority, entry id
-- Returns      claim.lua's reply: {now_ms, 'ok', absorbed, 0, n, 14 fields per run (as claim.lua),
--              0, 0, then index and headers of each run that has headers}
-- include: drop_entry
-- include: emit
-- include: events_maxlen
-- include: now_ms
-- include: record_defaults
-- include: stream_index

local group, worker = ARGV[1], ARGV[2]
local maxlen = events_maxlen(ARGV[3])
local since, per_band, n = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local base = KEYS[13]
local now = now_ms()
local known = {}
for i = 0, n - 1 do
  known[stream_index(ARGV[7 + i * 2]) .. ' ' .. ARGV[8 + i * 2]] = true
end
local runs, absorbed = {}, 0
local hdrs = {}  -- index, headers of each run that has headers (as claim.lua)
for i = 1, 10 do
  local pending = {}
  if redis.call('EXISTS', KEYS[i]) == 1 then
    pending = redis.call('XPENDING', KEYS[i], group, '-', '+', per_band, worker)
  end
  for _, p in ipairs(pending) do
    local eid = p[1]
    if not known[i .. ' ' .. eid] then
      local entry = redis.call('XRANGE', KEYS[i], eid, eid)[1]
      local tid = entry and entry[2][2]
      local r = {}
      if tid then
        r = redis.call('HMGET', base .. tid, 'status', 'eid', 'worker', 'started', 'attempt',
          'name', 'args', 'kwargs', 'maxr', 'timeout', 'retries', 'intr', 'enq', 'prio', 'idem',
          'hdr', 'lk', 'error', 'flow', 'grp')
      end
      if r[1] == 'running' and r[2] == eid and r[3] == worker then
        if tonumber(r[4] or '0') >= since then
          redis.call('XCLAIM', KEYS[i], group, worker, 0, eid, 'JUSTID')
          local o = #runs
          runs[o + 1] = tid
          runs[o + 2] = eid
          runs[o + 3] = r[5]
          runs[o + 4] = r[6]
          runs[o + 5] = r[7]
          runs[o + 6] = r[8] or ''
          runs[o + 7] = r[9] or DEF_MAXR
          runs[o + 8] = r[10] or ''
          runs[o + 9] = r[11] or '0'
          runs[o + 10] = r[12] or '0'
          runs[o + 11] = r[13] or '0'
          runs[o + 12] = r[14] or DEF_PRIO
          local flags = (r[15] and 'i' or '') .. (r[17] and 'l' or '') ..
            (r[18] and 'e' or '') .. (r[19] and 'f' or '') .. (r[20] and 'g' or '')  -- as claim's
          runs[o + 13] = flags == '' and '-' or flags
          runs[o + 14] = r[15] or ''
          if r[16] then
            hdrs[#hdrs + 1] = o / 14
            hdrs[#hdrs + 1] = r[16]
          end
        end
      else
        drop_entry(KEYS[i], group, eid)
        redis.call('HINCRBY', KEYS[12], 'absorbed', 1)
        emit(KEYS[11], maxlen, 'absorbed', tid or '', r[5], worker, eid)
        absorbed = absorbed + 1
      end
    end
  end
end
local out = {now, 'ok', absorbed, 0, #runs / 14}
for _, v in ipairs(runs) do out[#out + 1] = v end
out[#out + 1] = 0
out[#out + 1] = 0
for _, v in ipairs(hdrs) do out[#out + 1] = v end
return out
