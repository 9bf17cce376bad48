-- _common.lua: helpers prepended to every dtq script when it is loaded (see dtq/scripts/runner.py).
-- Not a script of its own. Times are Redis server milliseconds, so worker clocks never matter.
--
-- Hot paths hand redis.call strings, not Lua numbers: Redis 7.0 turns each number argument
-- (a millisecond time, a count, an attempt) into text with snprintf("%.17g") at every use,
-- where a string is passed as it is. string.format('%d') once per call makes the text for all
-- its uses (the figures: docs/performance.md, "Hand-written code").

-- The server's time in milliseconds: as a number, and as the text to store.
local function now_ms()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return ms, string.format('%d', ms)
end

-- Append a lifecycle event to the queue's capped event stream (maxlen 0 disables events).
-- maxlen is a number; its text is made once per script call, unless events_maxlen gave it.
local maxlen_n, maxlen_s = nil, nil
-- The events maxlen of this call from its ARGV text (returns the number): emit then sends the
-- text as it came instead of formatting the number again.
local function events_maxlen(text)
  maxlen_n, maxlen_s = tonumber(text), text
  return maxlen_n
end
local function emit(events_key, maxlen, etype, tid, attempt, worker, detail)
  if maxlen > 0 then
    if maxlen ~= maxlen_n then maxlen_n, maxlen_s = maxlen, string.format('%d', maxlen) end
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen_s, '*',
      'type', etype, 'tid', tid, 'attempt', attempt or '', 'worker', worker or '',
      'detail', detail or '')
  end
end

-- Append the events of one type that one call made for several tasks as ONE stream entry: its
-- tid field holds their tids, its attempt field their attempts, each separated by one space,
-- in the same order (worker and detail are the same for all). An entry of one task is
-- emit()'s, so readers see one format either way: dtq/admin/views.py events_from() makes an
-- entry into its events. One XADD per call instead of one per task: the three of a no-op task
-- (enqueued, started, succeeded) were about a sixth of its Redis time (docs/performance.md,
-- "Events in batches").
-- tids, attempts: tables of text, of the same length (an empty one appends nothing).
local function emit_batch(events_key, maxlen, etype, tids, attempts, worker, detail)
  if #tids > 0 then  -- (table.concat of one element is that element: emit()'s format)
    emit(events_key, maxlen, etype, table.concat(tids, ' '), table.concat(attempts, ' '),
      worker, detail)
  end
end

-- How many KEYS the caller gave, not counting the slot guard dtq appends on a Redis Cluster: a
-- declared key that never exists, so no script runs while its slot migrates (dtq/scripts/runner.py).
local function nkeys()
  local n = #KEYS
  if n > 0 and string.sub(KEYS[n], -11) == ':~slotguard' then return n - 1 end
  return n
end

-- The command that wakes result() waiters on a done channel (<P>:{q}:done:<id>, always in the
-- calling script's slot): SPUBLISH on a Redis Cluster (the slot guard is there, see nkeys()),
-- where a PUBLISH is broadcast by the cluster bus to every node and SPUBLISH stays on the
-- slot's node, whose SSUBSCRIBE waiters it reaches (dtq/sdk/donewait.py); PUBLISH on one
-- server. Found once per call, on the first publish.
local DONE_PUB
local function done_pub()
  if not DONE_PUB then DONE_PUB = nkeys() < #KEYS and 'SPUBLISH' or 'PUBLISH' end
  return DONE_PUB
end

-- A record leaves out a field while it holds dtq's default (docs/design.md, "Task record"):
-- attempt, retries and intr while 0, maxr while DEFAULT_MAX_RETRIES, prio while
-- DEFAULT_PRIORITY (dtq/record.py), result while the result is null. Every reader reads an
-- absent one as that default.
local DEF_MAXR, DEF_PRIO = '3', '5'

-- History (dtq/stats.py): per-minute counters of a queue, one string per hour <hist_base><hour>,
-- HIST_SLOTS unsigned 32-bit counters per minute: slot 0 enqueued (not written here: enqueue.lua
-- counts in a key per minute, P:{q}:he:<minute>, one INCR), 1 succeeded, 2 failed,
-- 3 retried, 4 cancelled, 5.. the run-time buckets. hist_add adds by_slot[slot] (the slots a
-- call counted) to the minute of now (ms) in ONE BITFIELD (a call counts all it did at once).
-- The first count of a minute (the key may be new) sets the key's expiry: ttl (text, seconds) after its hour
-- ends; so EXPIREAT runs about once a minute, not once a call. ttl nil, '' or '0': no history.
-- (Counters wrap past 2^32 - 1 in a minute: 71 million a second. Numbers concatenate as
-- integers below 1e14, hours and offsets among them.)
local HIST_SLOTS = 16
-- A run-time bucket's text (dtq.stats.bucket_of, as the worker sends it) -> its slot: a table,
-- not 5 + tonumber(b), which parses with strtod for every run.
local HIST_BUCKET_SLOT = {['0'] = 5, ['1'] = 6, ['2'] = 7, ['3'] = 8, ['4'] = 9, ['5'] = 10,
  ['6'] = 11, ['7'] = 12, ['8'] = 13, ['9'] = 14, ['10'] = 15}
local function hist_add(hist_base, ttl, now, by_slot)
  if ttl == nil or ttl == '' or ttl == '0' then return end
  local slots, counts = {}, {}
  for sl = 1, HIST_SLOTS - 1 do  -- (in slot order, not the table's)
    if by_slot[sl] then slots[#slots + 1] = sl; counts[#counts + 1] = by_slot[sl] end
  end
  if #slots == 0 then return end
  local m = math.floor(now / 60000)
  local h = math.floor(m / 60)
  local at = (m - h * 60) * HIST_SLOTS
  local a, k = {}, 0
  for j = 1, #slots do
    a[k + 1], a[k + 2], a[k + 3], a[k + 4] = 'INCRBY', 'u32', '#' .. (at + slots[j]), counts[j]
    k = k + 4
  end
  local key = hist_base .. h
  local got = redis.call('BITFIELD', key, unpack(a))
  for j = 1, #slots do
    if got[j] == counts[j] then
      redis.call('EXPIREAT', key, (h + 1) * 3600 + tonumber(ttl))
      return
    end
  end
end

-- Streams are passed as KEYS[1..10] for priorities 9..0.
-- (A table for the digits: tonumber parses with strtod, at a cost on every hot-path call.)
local STREAM_INDEX = {['9'] = 1, ['8'] = 2, ['7'] = 3, ['6'] = 4, ['5'] = 5, ['4'] = 6,
  ['3'] = 7, ['2'] = 8, ['1'] = 9, ['0'] = 10}
local function stream_index(prio)
  return STREAM_INDEX[prio or DEF_PRIO] or 10 - tonumber(prio)
end

-- Remove a delivered entry from the stream and its group's pending list.
local function drop_entry(stream_key, group, eid)
  redis.call('XACK', stream_key, group, eid)
  redis.call('XDEL', stream_key, eid)
end

-- Mark a task terminal: expire its record (and idempotency key) and wake result() waiters.
-- now (ms) and ttl (s) may be numbers or their text.
local function finish(rk, status, now, ttl, done_channel, idem_base)
  redis.call('HSET', rk, 'status', status, 'finished', now)
  redis.call('EXPIRE', rk, ttl)
  local idem = redis.call('HGET', rk, 'idem')
  if idem and string.sub(idem, 1, 3) == '~u:' then
    -- A unique task's key (dtq/requests.py unique_key) is released as soon as the task ends.
    if redis.call('GET', idem_base .. idem) == string.match(rk, '[^:]+$') then
      redis.call('DEL', idem_base .. idem)
    end
  elseif idem and idem ~= '' then
    redis.call('EXPIRE', idem_base .. idem, ttl)
  end
  redis.call(done_pub(), done_channel, status)
end

-- Count a failed attempt of a running task whose fence already passed: retry it later
-- (status "scheduled", due in delay ms) while retry_allowed and its budget allows, else end it
-- "failed" in the dead-letter queue. k = {sched, dlq, events, idem_base, maxlen, ttl,
-- done_prefix, now, worker}. Returns 'scheduled' or 'failed'.
local function spend_retry(k, rk, tid, attempt, retries, maxr, retry_allowed, delay, err)
  retries = tonumber(retries or '0') + 1
  redis.call('HSET', rk, 'retries', retries, 'error', err)
  if retry_allowed and retries <= tonumber(maxr or DEF_MAXR) then
    redis.call('HSET', rk, 'status', 'scheduled', 'due', k.now + delay)
    redis.call('HDEL', rk, 'eid')
    redis.call('ZADD', k.sched, k.now + delay, tid)
    emit(k.events, k.maxlen, 'retried', tid, attempt, k.worker, err)
    return 'scheduled'
  end
  redis.call('ZADD', k.dlq, k.now, tid)
  finish(rk, 'failed', k.now, k.ttl, k.done_prefix .. tid, k.idem_base)
  emit(k.events, k.maxlen, 'failed', tid, attempt, k.worker, err)
  return 'failed'
end

-- End a running task "cancelled" because its cancel was requested (the durable flag: reason,
-- its text), on a path that would otherwise move it on (a failure, a hand-back, a reclaim):
-- an acknowledged cancel is never lost. No retry is spent, it does not go to the dead-letter
-- queue; detail (the event's) says what ended the run. k as for spend_retry. Returns 'cancelled'.
local function end_cancelled(k, rk, tid, attempt, reason, detail)
  redis.call('HSET', rk, 'error', reason)
  finish(rk, 'cancelled', k.now, k.ttl, k.done_prefix .. tid, k.idem_base)
  emit(k.events, k.maxlen, 'cancelled', tid, attempt, k.worker, detail)
  return 'cancelled'
end

-- Fair groups (docs/groups.md). Keys under <gb> = group_base(<record prefix>), in the queue's
-- hash tag: per band (a priority digit) and group, at most ONE stream entry is the group's turn
-- (hash <gb>tk, field "<band>:<group>" -> that task's tid; '~' while the turn is withheld by the
-- group's pause or its cap); the group's other waiting tasks queue in list <gb>w:<band>:<group>.
-- The claim that takes a turn appends the group's next task to the end of the stream, behind
-- every other active group's turn: the stream is the band's round-robin of active groups, kept
-- in Redis and advanced inside the claim, so every worker serves the same order and a claim's
-- work does not grow with the number of groups. <gb>run:<group> (tid -> attempt) holds a group's
-- running tasks, <gb>idx the active groups (waiting or running; score: ms active since),
-- <gb>paused the held ones. While <gb>idx exists, a task without a group is group '' (its record
-- field grp = ''); while it does not, such a task goes to its stream as ever, and a queue that
-- never sees a group has no group key. An idle group (nothing waiting or running) leaves no key.
local function group_base(tbase) return string.sub(tbase, 1, -3) .. 'g:' end

-- Give group grp's next waiting task in band prio its turn (a stream entry at the end of the
-- band's stream); ids of tasks that no longer wait (cancelled) are dropped. Without one, the
-- turn field goes. Returns the task's tid, or nil.
local function group_issue(gb, streams, tbase, prio, grp)
  local f = prio .. ':' .. grp
  local w = gb .. 'w:' .. f
  while true do
    local tid = redis.call('LPOP', w)
    if not tid then break end
    local rk = tbase .. tid
    local st = redis.call('HMGET', rk, 'status', 'eid')
    if st[1] == 'queued' and not st[2] then
      redis.call('HSET', rk, 'eid', redis.call('XADD', streams[stream_index(prio)], '*', 't', tid))
      redis.call('HSET', gb .. 'tk', f, tid)
      return tid
    end
  end
  redis.call('HDEL', gb .. 'tk', f)
  return nil
end

-- The turn fields of group grp, bands 9..0 (HMGET: nil where none).
local function group_turns(gb, grp)
  return redis.call('HMGET', gb .. 'tk', '9:' .. grp, '8:' .. grp, '7:' .. grp, '6:' .. grp,
    '5:' .. grp, '4:' .. grp, '3:' .. grp, '2:' .. grp, '1:' .. grp, '0:' .. grp)
end

-- After a task of group grp left its turn, its list or its running set: when nothing of the group
-- runs and no turn of it is in a stream, a turn withheld by the cap goes out again (the highest
-- band's; unless the group is paused): no run is left whose end would give it back. When
-- nothing of it waits or runs, grp leaves the active groups. turns: group_turns's, or nil.
local function group_settle(gb, streams, tbase, grp, turns)
  if redis.call('EXISTS', gb .. 'run:' .. grp) == 1 then return end
  turns = turns or group_turns(gb, grp)
  local live = false
  for j = 1, 10 do
    if turns[j] and turns[j] ~= '~' then live = true end
  end
  if not live and redis.call('SISMEMBER', gb .. 'paused', grp) == 0 then
    for j = 1, 10 do
      if turns[j] == '~' then
        turns[j] = group_issue(gb, streams, tbase, string.format('%d', 10 - j), grp)
        if turns[j] then break end
      end
    end
  end
  for j = 1, 10 do
    if turns[j] then return end
  end
  redis.call('ZREM', gb .. 'idx', grp)
end

-- Where a task that is to wait (queued) goes: returns its stream entry's id when it gets one
-- (its group's turn; or no group while no group is active), else false (it waits in its group's
-- list: the caller clears the record's eid); and the group to store as the record's grp when
-- that changes ('' for an ungrouped task while groups are active), else nil.
-- stream: the task's band's stream; prio: its band (a digit, nil for the default); grp: its
-- record's grp (nil: none); gmode: whether groups are active (nil: not known yet).
local function group_put(stream, tbase, tid, prio, grp, gmode)
  prio = prio or DEF_PRIO
  local gb = group_base(tbase)
  local store = nil
  if not grp or grp == '' then
    if gmode == nil then gmode = redis.call('EXISTS', gb .. 'idx') == 1 end
    if not gmode then
      return redis.call('XADD', stream, '*', 't', tid), nil
    end
    if grp ~= '' then store = '' end
    grp = ''
  end
  local f = prio .. ':' .. grp
  if redis.call('HEXISTS', gb .. 'tk', f) == 1 then
    -- (A group with a turn, live or withheld, is among the active groups already.)
    redis.call('RPUSH', gb .. 'w:' .. f, tid)
    return false, store
  end
  redis.call('ZADD', gb .. 'idx', 'NX', now_ms(), grp)
  if redis.call('SISMEMBER', gb .. 'paused', grp) == 1 then
    redis.call('RPUSH', gb .. 'w:' .. f, tid)
    redis.call('HSET', gb .. 'tk', f, '~')
    return false, store
  end
  redis.call('HSET', gb .. 'tk', f, tid)
  return redis.call('XADD', stream, '*', 't', tid), store
end

-- group_put for a task whose record rk exists: writes the record's eid (or clears it) and grp.
-- Returns the entry id or false.
local function group_requeue(streams, tbase, rk, tid, prio, grp)
  local eid, store = group_put(streams[stream_index(prio)], tbase, tid, prio, grp)
  if eid then
    if store then redis.call('HSET', rk, 'eid', eid, 'grp', store)
    else redis.call('HSET', rk, 'eid', eid) end
  else
    redis.call('HDEL', rk, 'eid')
    if store then redis.call('HSET', rk, 'grp', store) end
  end
  return eid
end

-- A waiting task of group grp (band prio) leaves without starting (cancelled, expired, parked
-- behind a limit, found a duplicate): if it held the group's turn, the turn passes on.
local function group_pass(gb, streams, tbase, prio, grp, tid)
  prio = prio or DEF_PRIO
  local f = prio .. ':' .. grp
  local turn = redis.call('HGET', gb .. 'tk', f)
  if turn == tid then
    group_issue(gb, streams, tbase, prio, grp)
  else
    local w = gb .. 'w:' .. f
    redis.call('LREM', w, 1, tid)
    -- A withheld turn with no task left behind it goes too.
    if turn == '~' and redis.call('EXISTS', w) == 0 then redis.call('HDEL', gb .. 'tk', f) end
  end
  group_settle(gb, streams, tbase, grp)
end

-- A run of group grp ended or went back to waiting: it leaves the group's running set; a turn
-- withheld by the cap goes out again (the highest band's: one run ended, one may start), unless
-- the group is paused.
-- band (a band digit of the runs): given by a caller without a cap (complete.lua, its worker's
-- DTQ_GROUP_CONCURRENCY 0 for the queue), with tid a list of n of the group's ended runs
-- (n <= 200: unpack's bound on the Lua stack). Then while the group runs other tasks, or has a
-- live turn in that band, nothing else is read: without caps a turn is withheld only by a
-- pause, which a run's end does not lift; a turn another worker's cap withheld goes out at the
-- end of the group's last run (group_settle) instead, as the group still runs or has a live
-- turn.
local function group_end(gb, streams, tbase, grp, tid, band, n)
  if band then
    if redis.call('ZREM', gb .. 'run:' .. grp, unpack(tid, 1, n)) == 0 then return end
    if redis.call('EXISTS', gb .. 'run:' .. grp) == 1 then return end
    local t = redis.call('HGET', gb .. 'tk', band .. ':' .. grp)
    if t and t ~= '~' then return end
  elseif redis.call('ZREM', gb .. 'run:' .. grp, tid) == 0 then
    return
  end
  local turns = group_turns(gb, grp)
  if redis.call('SISMEMBER', gb .. 'paused', grp) == 0 then
    for j = 1, 10 do
      if turns[j] == '~' then
        turns[j] = group_issue(gb, streams, tbase, string.format('%d', 10 - j), grp)
        if turns[j] then break end
      end
    end
  end
  group_settle(gb, streams, tbase, grp, turns)
end

-- Whether group grp runs cap tasks or more (members whose record no longer runs that attempt,
-- e.g. purged, are dropped first).
local function group_full(gb, tbase, grp, cap)
  local run = gb .. 'run:' .. grp
  local n = redis.call('ZCARD', run)
  if n < cap then return false end
  local m = redis.call('ZRANGE', run, 0, -1, 'WITHSCORES')
  for j = 1, #m, 2 do
    local s = redis.call('HMGET', tbase .. m[j], 'status', 'attempt')
    if s[1] ~= 'running' or tonumber(s[2] or '0') ~= tonumber(m[j + 1]) then
      redis.call('ZREM', run, m[j])
      n = n - 1
    end
  end
  return n >= cap
end

-- Limits (dtq/limits.py). A running task with a limit key k holds a place in the zset
-- <lim_base>k:run (tid -> attempt); tasks parked behind k's concurrency limit wait in the list
-- <lim_base>k:held with status "queued" and no entry. Two sets of limit keys sit beside them
-- (no limit key makes these names: every key of a limit ends in :run, :held, :rate or :rwait):
-- <lim_base>~parked lists the keys whose held list may be non-empty (purge.lua reads it) and
-- <lim_base>~owed the keys whose release ran out of budget (limit_sweep.lua finishes it).
--
-- limit_unpark puts up to n parked tasks of key lk back into their priority streams (n nil: as
-- many as the limit has room for: lc of the first live one minus the runs holding a place),
-- looking at no more than budget parked ids. Dead ids (cancelled, purged, record gone) are
-- dropped; a task whose expiry passed while parked goes back too, for the claim to end it
-- "expired", without counting. A released live task is owed the place it was released for
-- (field lown, until its run starts or it is parked again: see limit_pass_on). Returns
-- released, more (1 when the budget ran out before n were released and ids are left) and the
-- number of ids looked at.
local function limit_unpark(lim_base, lk, base, streams, n, budget)
  local held = lim_base .. lk .. ':held'
  local released, looked, now = 0, 0, nil
  while n == nil or released < n do
    if looked >= budget then
      if redis.call('EXISTS', held) == 1 then return released, 1, looked end
      break
    end
    local ptid = redis.call('LPOP', held)
    if not ptid then
      -- Emptied here (a list empty from the start was taken off the index when it emptied).
      if looked > 0 then redis.call('SREM', lim_base .. '~parked', lk) end
      return released, 0, looked
    end
    looked = looked + 1
    local prk = base .. ptid
    local p = redis.call('HMGET', prk, 'status', 'eid', 'prio', 'exp', 'lc', 'grp')
    if p[1] == 'queued' and not p[2] then
      local live = true
      if p[4] then
        now = now or now_ms()
        live = tonumber(p[4]) > now
      end
      if live and n == nil then
        n = math.max(0, tonumber(p[5] or '1') - redis.call('ZCARD', lim_base .. lk .. ':run'))
        if n == 0 then
          redis.call('LPUSH', held, ptid)
          return released, 0, looked
        end
      end
      group_requeue(streams, base, prk, ptid, p[3], p[6])
      if live then
        redis.call('HSET', prk, 'lown', '1')
        released = released + 1
      end
    end
  end
  if redis.call('EXISTS', held) == 0 then redis.call('SREM', lim_base .. '~parked', lk) end
  return released, 0, looked
end

-- A run of task tid ended (or went back to waiting): free its place and release one parked task,
-- looking at no more than 200 parked ids; past that the key is owed a release (limit_sweep.lua,
-- run by the scheduler every tick, finishes it).
-- Call after the fence check, before the record's status changes matter to anyone else.
local function limit_release(lim_base, base, streams, rk, tid)
  if not lim_base then return end
  local lk = redis.call('HGET', rk, 'lk')
  if not lk then return end
  if redis.call('ZREM', lim_base .. lk .. ':run', tid) == 1 then
    local _, more = limit_unpark(lim_base, lk, base, streams, 1, 200)
    if more == 1 then redis.call('SADD', lim_base .. '~owed', lk) end
  end
end

-- A released task (field lown) ended without starting (cancelled, or expired at its claim):
-- the place it was owed goes to the next parked task of key lk, while the limit (lc) has room,
-- with limit_release's budget. The caller deletes lown with the status change.
local function limit_pass_on(lim_base, base, streams, lk, lc)
  local c = tonumber(lc or '0')
  if not lk or c <= 0 or redis.call('ZCARD', lim_base .. lk .. ':run') >= c then return end
  local _, more = limit_unpark(lim_base, lk, base, streams, 1, 200)
  if more == 1 then redis.call('SADD', lim_base .. '~owed', lk) end
end
