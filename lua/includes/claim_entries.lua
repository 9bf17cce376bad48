-- include: drop_entry
-- include: emit
-- include: emit_batch
-- include: finish
-- include: flow_note
-- include: group_base
-- include: group_issue
-- include: group_settle
-- include: limit_pass_on
-- include: now_ms
-- include: record_defaults
-- The claim transition as a function, shared by claim.lua and complete.lua. Both callers
-- pass the same KEYS layout:
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:paused  (while it exists nothing is claimed)
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:stats
-- KEYS[14]     P:{q}:t:      (task record key prefix)
-- KEYS[15]     P:{q}:idem:
-- KEYS[16]     P:{q}:sched   (rate-limited tasks wait there until their window has room)
-- KEYS[17]     P:{q}:lim:    (limit key prefix, see dtq/limits.py and limit_unpark.lua)
-- KEYS[18]     P:{q}:fair    (fair mode: each band's credit in the weighted round-robin)
-- KEYS[19]     P:{q}:decl    (task name -> "max_retries|timeout|expires_ms" workers declared)
-- KEYS[20]     P:{q}:f:, KEYS[21] P:{q}:flowq: a workflow step found expired ends its flow
--              (flow_note)
--
-- claim_entries(group, worker, count, maxlen, ttl, done_prefix, fair, gcap[, now, nows]) returns
-- the claim reply documented in claim.lua. gcap: the queue's group cap (DTQ_GROUP_CONCURRENCY;
-- 0: none). now, nows: the call's time (now_ms()) when the caller read
-- it already (complete.lua: one TIME per call, not two); read here when not given.

local BANDS = {'9', '8', '7', '6', '5', '4', '3', '2', '1', '0'}  -- KEYS[i]'s band

local function claim_entries(group, worker, remaining, maxlen, ttl, done_prefix, fair, gcap, now,
    nows)
  local base = KEYS[14]
  local gb = group_base(base)
  local sched, lim_base = KEYS[16], KEYS[17]
  if not now then now, nows = now_ms() end
  -- Whether the queue is paused (counts 1), whether it has active groups (the index, named
  -- twice, counts 2) and whether any of its groups is paused (the set, named 4 times): one call.
  local ik, pk = gb .. 'idx', gb .. 'paused'
  local e = redis.call('EXISTS', KEYS[11], ik, ik, pk, pk, pk, pk)
  if e % 2 == 1 then
    return {now, 'paused'}
  end
  local gmode = e % 4 >= 2
  local any_paused = e >= 4  -- whether any group of the queue is paused
  if redis.call('EXISTS', unpack(KEYS, 1, 10)) < 10 then
    return {now, 'no_streams'}
  end
  -- The reply, built in place: its head (absorbed, expired, n) is filled in at the end.
  local out = {now, 'ok', 0, 0, 0}
  local nrun = 0
  local hdrs = nil  -- run index (from 0), headers: only for runs that carry headers
  local started, started_at = {}, {}  -- the runs' tids and attempts: one 'started' entry
  local absorbed, expired, held = 0, 0, 0
  -- Bounds the work of one call when many entries are parked or absorbed in a row.
  local scanned, budget = 0, math.max(200, remaining * 4)

  -- New entries of band i (at most count), or nil. A band without entries (XLEN 0: entries are
  -- deleted when acknowledged) is not read: an XREADGROUP that finds nothing costs Redis about
  -- three times an XLEN, and tasks at the default priority leave the four bands above empty.
  -- known: the band has new entries (issue_ahead() just gave them): no XLEN.
  local function read(i, count, known)
    if not known and redis.call('XLEN', KEYS[i]) == 0 then return nil end
    local res = redis.call('XREADGROUP', 'GROUP', group, worker, 'COUNT',
      string.format('%d', count), 'STREAMS', KEYS[i], '>')
    -- res[1][2] on Redis; fakeredis (dtq.testing) answers {} for nil and flattens the reply.
    if res and res[1] then
      local entries = res[1][2] or res[2]
      if entries and #entries > 0 then return entries end
    end
    return nil
  end

  -- Whether the limits of task tid (record fields r[15..18]) let it start now; parks it if not.
  local function admit(i, eid, tid, rk, r)
    local lk = r[15]
    if not lk then return true end
    local lb = lim_base .. lk
    local lc = tonumber(r[16] or '0')
    if lc > 0 then
      local run = lb .. ':run'
      local n = redis.call('ZCARD', run)
      if n >= lc then
        -- A run that ended without releasing (its record purged) must not hold a place.
        local m = redis.call('ZRANGE', run, 0, -1, 'WITHSCORES')
        for j = 1, #m, 2 do
          local s = redis.call('HMGET', base .. m[j], 'status', 'attempt')
          if s[1] ~= 'running' or tonumber(s[2]) ~= tonumber(m[j + 1]) then
            redis.call('ZREM', run, m[j])
            n = n - 1
          end
        end
      end
      if n >= lc then
        drop_entry(KEYS[i], group, eid)
        redis.call('HDEL', rk, 'eid', 'lown')  -- the run that took the place releases next
        redis.call('RPUSH', lb .. ':held', tid)
        redis.call('SADD', lim_base .. '~parked', lk)  -- purge.lua finds held lists by it
        emit(KEYS[12], maxlen, 'held', tid, r[4] or '0', worker, 'concurrency ' .. lk)
        return false
      end
    end
    local lrn = tonumber(r[17] or '0')
    if lrn > 0 then
      local lrw = tonumber(r[18])
      local log = lb .. ':rate'
      redis.call('ZREMRANGEBYSCORE', log, '-inf', now - lrw)
      if redis.call('ZCARD', log) >= lrn then
        local oldest = tonumber(redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')[2])
        -- Spread a backlog over later windows so they do not all wake at once (the check
        -- above is what enforces the rate; this only saves futile wake-ups).
        local wait = lb .. ':rwait'
        local c = redis.call('INCR', wait)
        local due = oldest + lrw + math.floor((c - 1) / lrn) * lrw
        redis.call('PEXPIRE', wait, due - now + lrw)
        drop_entry(KEYS[i], group, eid)
        redis.call('HSET', rk, 'status', 'scheduled', 'due', due)
        redis.call('HDEL', rk, 'eid')
        redis.call('ZADD', sched, due, tid)
        emit(KEYS[12], maxlen, 'throttled', tid, r[4] or '0', worker, 'rate ' .. lk)
        return false
      end
    end
    return true
  end

  -- The values a record left to the declaration of its task (field dflt: letters of "mte",
  -- dtq/declared.py) are fixed by its first claim: fill_declared() puts them in r (take()'s
  -- HGETALL) and returns the fields to write with the run's start, so every later step (fail,
  -- reclaim, requeue, a retry's claim) reads them in the record. maxr is there from the
  -- enqueue (dtq's default, for workers that do not know dflt): "m" replaces it, and is not
  -- written when the declaration says the same (most tasks keep the default: a field the
  -- claim's HSET need not look up and rewrite, 2% of a by-name task's run in instructions).
  local decls = {}  -- task name -> {max_retries, timeout, expires ms}, read once per call
  local function fill_declared(r)
    local d = decls[r[5]]
    if d == nil then
      local raw = redis.call('HGET', KEYS[19], r[5])
      local dm, dt, de
      if raw then dm, dt, de = string.match(raw, '^(%d+)|([^|]*)|(%d*)$') end
      d = dm and {dm, dt, de} or {'3', '', ''}  -- none or unreadable: DEFAULT_MAX_RETRIES
      decls[r[5]] = d
    end
    local f, w = r[19], {'dflt', ''}
    local all = f == 'mte'
    if (all or string.find(f, 'm', 1, true)) and (r[8] or DEF_MAXR) ~= d[1] then
      r[8] = d[1]; w[3] = 'maxr'; w[4] = d[1]
    end
    if not r[9] and d[2] ~= '' and (all or string.find(f, 't', 1, true)) then
      r[9] = d[2]; w[#w + 1] = 'timeout'; w[#w + 1] = d[2]
    end
    if not r[3] and d[3] ~= '' and (all or string.find(f, 'e', 1, true)) then
      r[3] = string.format('%d', tonumber(r[12]) + tonumber(d[3]))  -- counts from the enqueue
      w[#w + 1] = 'exp'; w[#w + 1] = r[3]
    end
    return w
  end
  local NOFILL = {}

  -- The record's fields take() reads, by their place in r (nil: absent). One HGETALL, not an
  -- HMGET of these 20 names: in a small record (a listpack) HMGET scans the whole record for
  -- each absent field, and a plain task has 10 of them absent.
  local FIELD = {status = 1, eid = 2, exp = 3, attempt = 4, name = 5, args = 6, kwargs = 7,
    maxr = 8, timeout = 9, retries = 10, intr = 11, enq = 12, prio = 13, idem = 14, lk = 15,
    lc = 16, lrn = 17, lrw = 18, dflt = 19, hdr = 20, error = 21, flow = 22, lown = 23,
    grp = 24}
  local function read_record(rk)
    local raw = redis.call('HGETALL', rk)
    -- 24 places made at once (no rehash as they fill); every one starts nil.
    local r = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil}
    for j = 1, #raw, 2 do
      local k = FIELD[raw[j]]
      if k then r[k] = raw[j + 1] end
    end
    return r
  end

  -- Runs started in this call count in their group's running count (g:run:<group>, with its
  -- mark: group_settle), and so does each task issued ahead from the moment its entry is
  -- written (issue()); the changes of one group that follow one another (a group alone in its
  -- band: the whole batch) go in one INCRBY (run_flush), before anything reads the count (the
  -- cap; settle: group_settle) and at the end.
  local add_grp, add_n = nil, 0  -- (add_n: runs, plus GROUP_MARK for a group to mark)
  local function run_flush()
    if add_n == 1 then  -- (a number given to redis.call is formatted with "%.17g")
      redis.call('INCR', gb .. 'run:' .. add_grp)
    elseif add_n ~= 0 then
      redis.call('INCRBY', gb .. 'run:' .. add_grp, string.format('%d', add_n))
    end
    add_n = 0
  end
  local function run_add(grp, n)
    if grp ~= add_grp then
      run_flush()
      add_grp = grp
    end
    add_n = add_n + n
  end
  local function settle(grp)
    run_flush()
    group_settle(gb, KEYS, grp)
  end

  -- The turns this read pass of a band gave (group -> the tid now holding it; groups in order),
  -- and the turn holders issue_ahead() took off their lists (their turn's entry, read in this
  -- call, starts them without passing the turn again); track: how many more groups this pass
  -- may note (-1: none, it cannot issue ahead). The tasks issued ahead in this call (issue()):
  -- their entries' ids (issued) and groups (issued_grp). Tables are made when first needed: a
  -- claim of tasks without a group makes none.
  local passed, passed_groups, ahead, track = nil, nil, nil, -1
  local issued, issued_grp = nil, nil
  -- The group's next task in band prio (the head of its list w) gets the turn: group_issue.
  -- When none waits, the group's turn in this band ended: the group is marked, with the run
  -- that starts now, or for settle() to answer (group_settle). Returns the task's id or nil.
  local function next_turn(prio, grp, w)
    local t = group_issue(gb, KEYS, prio, grp, w)
    if not t then run_add(grp, GROUP_MARK) end
    return t
  end
  local function pass_on(prio, grp, w)
    local t = next_turn(prio, grp, w)
    if t and track >= 0 then
      if not passed then passed, passed_groups = {}, {} end
      if not passed[grp] then
        if track == 0 then
          track = -1
          return
        end
        track = track - 1
        passed_groups[#passed_groups + 1] = grp
      end
      passed[grp] = t
    end
  end
  -- Task tid, the live turn of group grp in band prio (the head of its list), starts or leaves:
  -- it leaves the list and the group's next task gets its turn.
  local function pass_turn(prio, grp, tid)
    local w = gb .. 'w:' .. prio .. ':' .. grp
    local h = redis.call('LPOP', w)
    if h ~= tid then  -- (not the head: the layout says never; the head keeps its turn)
      if h then redis.call('LPUSH', w, h) end
      redis.call('LREM', w, 1, tid)
      return
    end
    pass_on(prio, grp, w)
  end

  -- The queue's one active group, false when it has more (issue_solo: read once a call, again
  -- after a task queued before the first group joins group '').
  local solo = nil
  -- Whether group grp is paused (no call while no group of the queue is).
  local function paused(grp)
    return any_paused and redis.call('SISMEMBER', gb .. 'paused', grp) == 1
  end
  -- Ids LPOP took off the head of list w go back, as they were.
  local function push_back(w, tids)
    for j = #tids, 1, -1 do redis.call('LPUSH', w, tids[j]) end
  end

  -- Fair groups (docs/groups.md): whether entry eid of band i (task tid of group grp, band prio)
  -- may start now. An entry of a task whose record names its group is that group's live turn
  -- (the head of its list: every path that gives a grouped task an entry makes it the turn,
  -- or issues it ahead in this call). A task queued without a group before the queue's first
  -- group (legacy) joins group '': it becomes its turn when the group has none, else it waits in
  -- the group's list. A paused group, or one at its cap (the cap is a named group's: tasks
  -- without a group are not capped, groups or none), has its turn withheld ('~' in front of
  -- the task at the head of its list; no attempt is spent; the resume or the end of one of its
  -- runs gives the turn back). When it starts, the group's next task gets its turn, at the
  -- stream's end.
  -- popped: the entry is group_issue's and take() took the task's id off the head of the list
  -- (the list's key). issued: the entry is the task's own, issued ahead in this call
  -- (issue(): no cap, the group not paused): it holds no turn.
  local function group_take(i, eid, tid, rk, prio, grp, legacy, popped, issued)
    if issued then return true end
    if ahead and ahead[tid] then  -- its turn, issued ahead: the group's next has its entry
      ahead[tid] = nil
      return true
    end
    local w = popped  -- (the list's key, made only when needed: each is a new string)
    if legacy then
      w = gb .. 'w:' .. prio .. ':' .. grp
      redis.call('HSET', rk, 'grp', '')
      redis.call('ZADD', gb .. 'idx', 'NX', now, grp)
      solo = nil
      if redis.call('RPUSH', w, tid) > 1 then
        drop_entry(KEYS[i], group, eid)
        redis.call('HDEL', rk, 'eid')
        return false
      end
    end
    -- (The cap reads the group's running count: exact, as every start and end changes it. A
    -- turn withheld for the cap marks the group, so the end of its last run gives the turn back
    -- on a worker without a cap too: group_end.)
    local hold = any_paused and paused(grp)  -- (no call while no group is paused)
    if not hold and gcap > 0 and grp ~= '' then
      run_flush()
      local v = tonumber(redis.call('GET', gb .. 'run:' .. grp) or '0')
      if v % GROUP_MARK >= gcap then
        hold = true
        if v < GROUP_MARK then run_add(grp, GROUP_MARK) end
      end
    end
    if hold then
      w = w or gb .. 'w:' .. prio .. ':' .. grp
      drop_entry(KEYS[i], group, eid)
      if popped then
        redis.call('LPUSH', w, tid, '~')
      else
        redis.call('HDEL', rk, 'eid')
        redis.call('LPUSH', w, '~')
      end
      return false
    end
    if popped then pass_on(prio, grp, w) else pass_turn(prio, grp, tid) end
    return true
  end

  -- A task of group grp whose entry (its turn, or its own issued ahead) was delivered ends
  -- before it starts.
  local function group_left(tid, prio, grp, popped, issued)
    if issued then
      run_add(grp, -1)
    elseif ahead and ahead[tid] then
      ahead[tid] = nil
    elseif popped then
      pass_on(prio, grp, popped)
    elseif redis.call('LINDEX', gb .. 'w:' .. prio .. ':' .. grp, '0') == tid then
      pass_turn(prio, grp, tid)
    end
    settle(grp)
  end

  -- Tasks issued ahead: tids[from..] (ids taken off the head of group grp's list in band i)
  -- each get an entry of their own, to be read by this very call (issue_ahead, issue_solo make
  -- sure the read's count reaches them): take() starts the task by it while it waits without an
  -- entry, its record's eid written with the start. Each is counted in the group's running count
  -- from now, so nothing in this call (a settle) sees the group idle meanwhile; take() keeps the
  -- count for its run, or takes it out when the task does not start. (The records are not read
  -- here: take() reads them anyway, and absorbs the entry of a task that no longer waits.)
  local function issue(i, grp, tids, from)
    issued, issued_grp = issued or {}, issued_grp or {}
    local n = 0
    for j = from, #tids do
      local t = tids[j]
      if not issued[t] then  -- (a second copy of a task issued in this call: dropped)
        issued[t] = redis.call('XADD', KEYS[i], '*', 't', t)
        issued_grp[t] = grp
        n = n + 1
      end
    end
    if n > 0 then run_add(grp, n) end
  end

  -- Band i's read returned every entry it had, and the claim has slots left: the stream now
  -- holds only the turns this pass gave, one per group with more waiting. Re-reading it would
  -- cost an XREADGROUP per round of those groups (per task for a group alone in its band). So
  -- each of them gets its equal share of the slots left now: its turn's task (the holder) and
  -- the next ones (they leave the list) are issued ahead (issue()), delivered by the next read
  -- of this very call, while the task after them takes the group's turn (its entry behind all
  -- of theirs); the holder starts by its turn's entry without passing the turn again. No claim
  -- sees them waiting, so the order between groups is that of one round each; not with a cap
  -- (the running count decides).
  local function issue_ahead(i, prio)
    local k = #passed_groups
    local q = math.floor((remaining - k) / k)
    if gcap > 0 or q < 1 or scanned + remaining > budget then return false end
    ahead = ahead or {}
    local turns = {}  -- the lists whose next task takes the turn, after every group's share
    for _, grp in ipairs(passed_groups) do
      local w = gb .. 'w:' .. prio .. ':' .. grp
      local holder = passed[grp]
      -- (the turn's task, the head, and the q behind it; none of a paused group: its turn
      -- passed on from a task that did not start, and the read withholds it)
      local tids = nil
      if not paused(grp) then
        tids = redis.call('LPOP', w, string.format('%d', q + 1))
      end
      if tids and tids[1] == holder then
        ahead[holder] = true
        issue(i, grp, tids, 2)
        turns[#turns + 1] = grp
        turns[#turns + 1] = w
      elseif tids then  -- (the layout says never: the list goes back as it was)
        push_back(w, tids)
      end
    end
    for j = 1, #turns, 2 do next_turn(prio, turns[j], turns[j + 1]) end
    return true  -- (the passed turns' entries at least are new in the band)
  end

  -- Before band i's first read (n: the band's XLEN): when the queue has one active group and
  -- the band holds one entry not delivered yet (the group's turn: the head of its list in band
  -- prio), the tasks behind the head are issued ahead (issue()), as many as the claim has slots
  -- left after the head. The read then takes the turn and them at once: a group alone in its
  -- band costs one XREADGROUP per claim, not two (the second, issue_ahead's, walks its stream
  -- node again). The entries not delivered are the band's less those pending (an entry is
  -- deleted in the call that acknowledges it), so the read's count reaches every entry issued.
  -- Not with a cap (the running count decides), nor while the group is paused (its turn is
  -- withheld by the read).
  local function issue_solo(i, prio, n)
    if scanned + remaining > budget then return end
    if solo == nil then
      local only = redis.call('ZRANGE', gb .. 'idx', '0', '1')
      solo = #only == 1 and only[1]
    end
    if not solo then return end
    local grp = solo
    if paused(grp) then return end
    if n - redis.call('XPENDING', KEYS[i], group)[1] ~= 1 then return end
    local w = gb .. 'w:' .. prio .. ':' .. grp
    local tids = redis.call('LPOP', w, string.format('%d', remaining))
    if not tids then return end
    if tids[1] == '~' then  -- (withheld: the list goes back as it was)
      push_back(w, tids)
      return
    end
    redis.call('LPUSH', w, tids[1])  -- (the head keeps its turn)
    issue(i, grp, tids, 2)
  end

  -- Handle one delivered entry of band i; returns true when a run started.
  local function take(i, entry)
    scanned = scanned + 1
    local eid, fields = entry[1], entry[2]
    local tid = fields[2]
    local rk = base .. tid
    local r = read_record(rk)
    -- An entry group_issue gave (field g: the group, tg) is the group's turn while the task's id
    -- heads the group's list in this band and the task waits without an entry of its own: its
    -- record names no entry (it is written with the run's start: wr). popped: the id was
    -- taken off the list here (the list's key). An entry issue() gave in this call (ig: the
    -- group whose list it was taken from) is the task's own while it waits without one, in
    -- that group and band.
    local tg, popped, wr, ig = fields[4], nil, false, nil
    if issued and issued[tid] == eid then
      ig = issued_grp[tid]
      if r[1] == 'queued' and not r[2] and r[24] == ig and (r[13] or DEF_PRIO) == BANDS[i] then
        wr, r[2] = true, eid
      end
    elseif tg and not (ahead and ahead[tid]) then
      local w = gb .. 'w:' .. BANDS[i] .. ':' .. tg
      local h = redis.call('LPOP', w)
      if h == tid and r[1] == 'queued' and not r[2] and r[24] == tg and
          (r[13] or DEF_PRIO) == BANDS[i] then
        popped, wr, r[2] = w, true, eid
      elseif h == tid and not (r[1] == 'queued' and r[2]) then
        -- The id of a task that no longer waits here: the turn passes on; the entry is absorbed.
        pass_on(BANDS[i], tg, w)
        settle(tg)
      elseif h then
        redis.call('LPUSH', w, h)  -- (not this task's turn: the list stays as it was)
      end
    elseif tg and r[1] == 'queued' and not r[2] then  -- (its turn was issued ahead: see above)
      wr, r[2] = true, eid
    end
    if r[1] == 'queued' and r[2] == eid then
      local grp, legacy, issued = r[24], false, ig ~= nil
      if not grp then
        if gmode then grp, legacy = '', true end
      end
      local fill = NOFILL
      if r[19] and r[19] ~= '' then fill = fill_declared(r) end
      if r[3] and tonumber(r[3]) <= now then
        drop_entry(KEYS[i], group, eid)
        redis.call('HSET', rk, 'error', 'expired before it started', unpack(fill))
        finish(rk, 'expired', now, ttl, done_prefix .. tid, KEYS[15])
        emit(KEYS[12], maxlen, 'expired', tid, r[4] or '0', worker, '')
        expired = expired + 1
        if r[23] then  -- released for a place it will not take: the next parked task gets it
          redis.call('HDEL', rk, 'lown')
          limit_pass_on(lim_base, base, KEYS, r[15], r[16])
        end
        if grp then group_left(tid, r[13] or DEF_PRIO, grp, popped, issued) end
        local fl = redis.call('HGET', rk, 'flow')  -- (the expiry path only: no cost otherwise)
        if fl then
          flow_note({streams = KEYS, sched = sched, events = KEYS[12], tbase = base,
            fbase = KEYS[20], flowq = KEYS[21], maxlen = maxlen, ttl = ttl,
            done_prefix = done_prefix}, fl, 'expired', 'expired before it started')
        end
        return false
      end
      if grp and not group_take(i, eid, tid, rk, r[13] or DEF_PRIO, grp, legacy, popped,
          issued) then
        held = held + 1
        return false
      end
      if not admit(i, eid, tid, rk, r) then  -- (parked by a limit: out of its group till then)
        held = held + 1
        if issued then run_add(grp, -1) end
        if grp then settle(grp) end
        return false
      end
      local attempt = tonumber(r[4] or '0') + 1  -- (absent while 0: record_defaults)
      local attempt_s = string.format('%d', attempt)  -- stored and emitted as text (docs/design.md)
      if wr then
        redis.call('HSET', rk, 'status', 'running', 'attempt', attempt_s, 'worker', worker,
          'started', nows, 'eid', eid, unpack(fill))
      else
        redis.call('HSET', rk, 'status', 'running', 'attempt', attempt_s, 'worker', worker,
          'started', nows, unpack(fill))
      end
      if r[23] then redis.call('HDEL', rk, 'lown') end  -- the place is taken: owed no more
      if grp and not issued then run_add(grp, 1) end  -- (run_flush; issued: counted already)
      if r[15] then
        local lb = lim_base .. r[15]
        if tonumber(r[16] or '0') > 0 then redis.call('ZADD', lb .. ':run', attempt, tid) end
        if tonumber(r[17] or '0') > 0 then
          redis.call('ZADD', lb .. ':rate', now, tid .. ':' .. attempt)
          redis.call('PEXPIRE', lb .. ':rate', tonumber(r[18]))
        end
      end
      started[nrun + 1] = tid
      started_at[nrun + 1] = attempt_s
      local o = 5 + nrun * 14  -- the run's 14 fields (claim.lua's header names them)
      out[o + 1] = tid
      out[o + 2] = eid
      out[o + 3] = attempt
      out[o + 4] = r[5]
      out[o + 5] = r[6]
      out[o + 6] = r[7] or ''
      out[o + 7] = r[8] or DEF_MAXR
      out[o + 8] = r[9] or ''
      out[o + 9] = r[10] or '0'
      out[o + 10] = r[11] or '0'
      out[o + 11] = r[12]
      out[o + 12] = r[13] or DEF_PRIO
      -- Which of idem, lk, error, flow, grp the record holds (none changes while this run holds
      -- the task): the worker gives them back with the outcome, so complete.lua's fence reads
      -- 3 fields, not 8 (each absent one costs HMGET a scan of the whole record).
      local flags = '-'
      if r[14] or r[15] or r[21] or r[22] then
        flags = (r[14] and 'i' or '') .. (r[15] and 'l' or '') .. (r[21] and 'e' or '') ..
          (r[22] and 'f' or '') .. (grp and 'g' or '')
      elseif grp then
        flags = 'g'
      end
      out[o + 13] = flags
      out[o + 14] = r[14] or ''
      if r[20] then  -- headers for the worker's middleware (e.g. traceparent): see claim.lua
        hdrs = hdrs or {}
        hdrs[#hdrs + 1] = nrun
        hdrs[#hdrs + 1] = r[20]
      end
      nrun = nrun + 1
      remaining = remaining - 1
      return true
    end
    -- A duplicate (or an entry whose task is gone): acknowledged, never run.
    drop_entry(KEYS[i], group, eid)
    if ig then
      -- Issued ahead (issue()) to a task that no longer waits (ended, or waiting with an entry
      -- of its own): it leaves the group's running count, which held its place.
      run_add(ig, -1)
      settle(ig)
    elseif r[24] then
      settle(r[24])  -- (a duplicate is no turn: its task's place is its record's)
    end
    redis.call('HINCRBY', KEYS[13], 'absorbed', '1')
    emit(KEYS[12], maxlen, 'absorbed', tid, r[4] or (r[1] and '0'), worker, eid)
    absorbed = absorbed + 1
    return false
  end

  if not fair then
    -- Strict priority: drain a band (re-reading past parked or absorbed entries) before the next.
    for i = 1, 10 do
      local known = false  -- (issue_ahead() gave entries, or XLEN was read: read() needs none)
      local empty = false
      if gmode and gcap == 0 and remaining > 1 then
        local n = redis.call('XLEN', KEYS[i])
        if n == 0 then
          empty = true
        else
          known = true
          issue_solo(i, BANDS[i], n)
        end
      end
      while not empty and remaining > 0 and scanned < budget do
        local asked = remaining
        local entries = read(i, asked, known)
        known = false
        if not entries then break end
        passed, passed_groups = nil, nil
        -- (A full read leaves entries behind: no issue ahead, nothing to note. Else each
        -- group needs 2 slots left of the read's count to be given 1 more.)
        track = (#entries < asked and gcap == 0) and math.floor(asked / 2) or -1
        for _, entry in ipairs(entries) do take(i, entry) end
        if track >= 0 and passed and remaining > 1 then
          known = issue_ahead(i, BANDS[i])
        end
      end
      if remaining <= 0 or scanned >= budget then break end
    end
  else
    -- Smooth weighted round-robin over the bands that have entries: each pick adds every
    -- eligible band's weight to its credit, takes the band with the most credit and charges it
    -- the total. Band p (KEYS index 10 - p) weighs p + 1, so p9 gets 10 picks to p0's 1.
    local raw = redis.call('HMGET', KEYS[18], 'b1', 'b2', 'b3', 'b4', 'b5', 'b6', 'b7', 'b8',
      'b9', 'b10')
    local credit, eligible = {}, {}
    for i = 1, 10 do
      credit[i] = tonumber(raw[i] or '0')
      eligible[#eligible + 1] = i
    end
    while remaining > 0 and scanned < budget and #eligible > 0 do
      local total, best, best_pos = 0, nil, nil
      for pos, i in ipairs(eligible) do
        credit[i] = credit[i] + (11 - i)
        total = total + (11 - i)
        if best == nil or credit[i] > credit[best] then best, best_pos = i, pos end
      end
      credit[best] = credit[best] - total
      local entries = read(best, 1)
      if entries then
        take(best, entries[1])
      else
        -- An empty band banks no credit: it would burst when it fills again.
        credit[best] = 0
        table.remove(eligible, best_pos)
      end
    end
    local save = {}
    for i = 1, 10 do
      -- Bounded so a band emptied with credit owed never drifts far.
      local c = math.max(-55, math.min(55, credit[i]))
      save[#save + 1] = 'b' .. i
      save[#save + 1] = c
    end
    redis.call('HSET', KEYS[18], unpack(save))
  end

  run_flush()
  emit_batch(KEYS[12], maxlen, 'started', started, started_at, worker)
  out[3], out[4], out[5] = absorbed, expired, nrun
  out[#out + 1] = held
  local more = 0
  if remaining > 0 and scanned >= budget then more = 1 end
  out[#out + 1] = more
  if hdrs then
    for _, v in ipairs(hdrs) do out[#out + 1] = v end
  end
  return out
end
