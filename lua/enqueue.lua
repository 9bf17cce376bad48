-- enqueue.lua: create one or more tasks (bulk enqueue is one call).
--
-- KEYS[1]      P:{q}:sched   (zset of scheduled tasks, score = due ms)
-- KEYS[2]      P:{q}:events
-- KEYS[3]      P:{q}:t:      (task record key prefix; names the slot)
-- KEYS[4]      P:{q}:idem:   (idempotency key prefix)
-- KEYS[5]      P:{q}:he:<minute>: the history's counter of the tasks enqueued in this minute
--              (dtq/stats.py; the minute by the client's clock), or P:{q}:he: when ARGV[3] is 0
-- KEYS[6..]    the priority streams P:{q}:p<band> of the bands this call's tasks go to (only
--              those: a single enqueue names one stream, not ten; each is found by its band
--              digit, the key's last character)
-- ARGV[1]      events maxlen (0 = no events)
-- ARGV[2]      n, the number of tasks
-- ARGV[3]      the counter's TTL (s), set when a call makes it; '0': not counted (history off)
-- ARGV[4]      the layout: the names of the fields each task sends, in order, separated by
--              single spaces. Always first the 5 fixed ones, "tid name args prio maxr": tid,
--              name, args(JSON), priority(0-9), max_retries (a number: dtq's default where the
--              enqueue left it to the worker's declaration). Then any of these options, each
--              at most once, in any order (an option left out is empty for every task):
--                dflt     letters of "mte": which of max_retries/timeout/expires the enqueue left
--                         to the worker's declaration (record field dflt, dtq/declared.py)
--                kwargs   JSON or ''
--                timeout  seconds, '' = none
--                delay    ms, 0 = now
--                exp      expires: ms relative to now, 0 = never
--                idem     idempotency key, '' = none
--                meta     JSON or ''
--                lk       its limit key, '' = none; with it lc, lrn, lrw: the concurrency,
--                         the rate's count and its window in ms (dtq/limits.py)
--                hdr      JSON object of strings set by middleware (e.g. a W3C traceparent) or
--                         ''; handed to the worker in the claim reply
--                grp      its fair group, '' = none (docs/groups.md)
--              The caller names only the options some task of the call has: a bulk enqueue of
--              plain tasks sends 5 fields per task and a single one 9 arguments in all (each
--              argument costs Redis a Lua string); the layout is read once per call, and the
--              plain one, a by-name enqueue's ("tid name args prio maxr dflt") and a grouped
--              task's (those with "grp" after them) are matched whole, without parsing.
-- ARGV[5..]    per task, the fields the layout names (n times).
-- Returns      flat list, 3 per task: tid, status, created(1) | existing(0)
--              For an idempotency key that names a live task, that task's tid and status.
--              A task whose record exists already was made by this very call, sent before:
--              tids are random and made per enqueue, so that is a client's re-send after the
--              connection lost the reply. It is answered with its status now and created(1),
--              and nothing is written again (no second stream entry, no second event).
--
-- The call's time ("enq", and what delays and expiry count from) is read once: from the first
-- stream entry's id (its milliseconds are the server's clock; a single task that waits in its
-- fair group's list writes its event first for that), or by TIME when a scheduled task comes
-- first (TIME is a call of its own: a tenth of a single enqueue's cost).
--
-- A single enqueue is the hot path (docs/performance.md, B): it builds no table but its reply,
-- and a plain task's record is written by the one HSET below with nothing unpacked after it.
-- include: emit
-- include: emit_batch
-- include: events_maxlen
-- include: group_base
-- include: group_put
-- include: now_ms
-- include: record_defaults

local maxlen = events_maxlen(ARGV[1])
local n = ARGV[2] == '1' and 1 or tonumber(ARGV[2])  -- (a single enqueue's: no strtod)
-- The layout (ARGV[4]), read once: F fields per task; at: each option's offset among them, and
-- copy: offset, name of each option stored in the record as sent (when not empty); both nil
-- for the fixed 5 only (the plain path) and for those and dflt (by_name: a by-name enqueue's,
-- which makes no table for it).
local F, at, copy = 5, nil, nil
local by_name = ARGV[4] == 'tid name args prio maxr dflt'
-- A by-name enqueue of grouped tasks: its records are written without a table (below).
local by_name_grp = false
if by_name then
  F = 6
elseif ARGV[4] == 'tid name args prio maxr grp' then  -- a grouped task's, also not parsed
  F, at, copy = 6, {grp = 5}, {5, 'grp'}
elseif ARGV[4] == 'tid name args prio maxr dflt grp' then
  F, at, copy, by_name_grp = 7, {dflt = 5, grp = 6}, {5, 'dflt', 6, 'grp'}, true
elseif ARGV[4] ~= 'tid name args prio maxr' then
  if string.sub(ARGV[4], 1, 24) ~= 'tid name args prio maxr ' then
    return redis.error_reply('DTQ_BAD_CALL a layout starts with "tid name args prio maxr"')
  end
  -- 1: stored as sent; 0: read below
  local known = {dflt = 1, kwargs = 1, timeout = 1, meta = 1, hdr = 1, grp = 1, lk = 1, lc = 1,
    lrn = 1, lrw = 1, delay = 0, exp = 0, idem = 0}
  at, copy = {}, {}
  for f in string.gmatch(string.sub(ARGV[4], 25), '%S+') do
    if at[f] or not known[f] then
      return redis.error_reply('DTQ_BAD_CALL unknown or repeated task field ' .. f)
    end
    at[f] = F
    if known[f] == 1 then copy[#copy + 1] = F; copy[#copy + 1] = f end
    F = F + 1
  end
end
-- Before anything is written: every task's band has its stream among the keys.
local stream, streams = KEYS[6], nil  -- the one band's stream; or band digit -> stream
local bad = nil
-- The keys but the slot guard (nkeys(), inlined: every key from KEYS[6] on is a
-- stream, which ends in its band digit; the guard ends in 'd').
local nk = #KEYS
if string.byte(KEYS[nk], -1) == 100 then nk = nk - 1 end
if nk == 6 then
  local band = string.sub(stream, -1)
  for i = 0, n - 1 do
    if ARGV[8 + i * F] ~= band then bad = ARGV[8 + i * F]; break end
  end
else
  streams = {}
  for i = 6, nk do streams[string.sub(KEYS[i], -1)] = KEYS[i] end
  for i = 0, n - 1 do
    if not streams[ARGV[8 + i * F]] then bad = ARGV[8 + i * F]; break end
  end
end
if bad or not stream then
  return redis.error_reply('DTQ_BAD_CALL no stream key for priority ' .. tostring(bad))
end

local NONE = {}
-- A bulk call's 'enqueued' events, by status (the event's detail): one entry each, at the end
-- (includes/emit_batch.lua); a single enqueue emits its one event as it goes.
local batch = n > 1 and {queued = {{}, {}}, scheduled = {{}, {}}} or nil
local now, nows = nil, nil  -- the call's time: number, and its text for the record
local out = nil
local made = 0  -- tasks this call created: counted in the history at the end
local gmode = nil  -- whether the queue has active groups (read once, with a record: below)
-- A bulk call's new groups enter the index of active groups by one ZADD, at the end: their
-- entries (score, group, ...) as group_put collects them.
local gidx = n > 1 and {} or nil
-- The tasks of one call that follow a task of the same group and band wait in that group's
-- list (group_put made it, and it has the turn): they are appended by one RPUSH (pushed),
-- at the next task of another list and at the end. wl: that list's "<band>:<group>". (No
-- table or function is made for it before a bulk call's second task of a group: a plain
-- single enqueue pays nothing.)
local wl, pushed, npushed = nil, nil, 0
-- The options' offsets (nil: not sent), and how many values copy holds: read once, not per task.
local at_delay, at_idem, at_exp, at_grp = nil, nil, nil, nil
local ncopy = 0
if at then at_delay, at_idem, at_exp, at_grp, ncopy = at.delay, at.idem, at.exp, at.grp, #copy end
for i = 0, n - 1 do
  local o = 5 + i * F
  local tid, prio = ARGV[o], ARGV[o + 3]
  local delay, idem = 0, ''
  if at_delay then delay = tonumber(ARGV[o + at_delay]) end
  if at_idem then idem = ARGV[o + at_idem] end
  local status, created = nil, 1
  local emitted = false  -- (its 'enqueued' event, when written before the record)
  if idem ~= '' then  -- an idempotency key naming a live task answers with that task
    local prev = redis.call('GET', KEYS[4] .. idem)
    if prev then
      status = redis.call('HGET', KEYS[3] .. prev, 'status')
      if status and prev ~= tid then tid, created = prev, 0 end  -- (prev == tid: a re-send)
    end
  end
  local rk = KEYS[3] .. tid
  if status then  -- (set: a re-send, above)
  elseif gmode == nil and delay == 0 and not (at_grp and ARGV[o + at_grp] ~= '') then
    -- The first task of the call to go to a stream without a group asks whether groups are
    -- active with the same call that asks whether its record exists (a re-send): the index
    -- counts 2, the record 1. A queue without groups pays no call for them.
    local ik = string.sub(KEYS[3], 1, -3) .. 'g:idx'
    local e = redis.call('EXISTS', rk, ik, ik)
    gmode = e >= 2 or (gidx ~= nil and gidx[1] ~= nil)  -- (or a new group of this call)
    if e % 2 == 1 then status = redis.call('HGET', rk, 'status') end
  else
    status = redis.call('HGET', rk, 'status')
  end
  if not status then
    local wk, wv  -- where the task waits: its stream entry's id, or its due time
    local gstore = nil  -- grp to store: '' for a task without a group while groups are active
    if delay > 0 then
      status = 'scheduled'
      if not nows then now, nows = now_ms() elseif not now then now = tonumber(nows) end
      wk, wv = 'due', now + delay
      redis.call('ZADD', KEYS[1], wv, tid)
    else
      status = 'queued'
      local sk = streams and streams[prio] or stream
      local grp = at_grp and ARGV[o + at_grp] or ''
      if grp ~= '' or gmode then  -- its group's turn, or its group's list (docs/groups.md)
        local l = prio .. ':' .. grp
        if l == wl and npushed < 200 then  -- (200: unpack's bound on the Lua stack)
          npushed = npushed + 1
          pushed = pushed or {}
          pushed[npushed] = tid
          if grp == '' then gstore = '' end
          wk, wv = 'status', status
        else
          if npushed > 0 then
            redis.call('RPUSH', group_base(KEYS[3]) .. 'w:' .. wl, unpack(pushed, 1, npushed))
            npushed = 0
          end
          local eid, store = group_put(sk, KEYS[3], tid, prio, grp ~= '' and grp or nil, gmode,
            gidx, nows)
          gstore = store
          if eid then wk, wv = 'eid', eid else wk, wv = 'status', status end
          if n > 1 then wl = l end
        end
      else
        wk, wv = 'eid', redis.call('XADD', sk, '*', 't', tid)
      end
      if not nows then  -- an entry id's milliseconds (a plain find: cheaper than a pattern)
        if wk == 'eid' then
          nows = string.sub(wv, 1, string.find(wv, '-', 1, true) - 1)
        elseif n == 1 and maxlen > 0 then
          -- (A single task waiting in its group's list: its event, written first, has the
          -- entry id that gives the time; no TIME call.)
          local id = emit(KEYS[2], maxlen, 'enqueued', tid, '0', '', status)
          emitted = true
          nows = string.sub(id, 1, string.find(id, '-', 1, true) - 1)
        else
          now, nows = now_ms()
        end
      end
    end
    -- The record's optional fields: h[1..k]. (Tables are made with their places: one grown a
    -- field at a time is rehashed at each of its first sizes, which cost a grouped bulk enqueue
    -- 5% of its instructions.)
    local h, k = NONE, 0
    local maxr = ARGV[o + 4]
    -- A task enqueued by name at the default band and retries (make bench's), with its group
    -- or none: its record in one HSET of fixed shape, with no table (each table made and
    -- unpacked cost a bulk enqueue several percent). A grouped one writes its group where a
    -- task without one writes its entry (wk, wv) when it waits in its group's list; a group's
    -- turn (its entry's id) writes both.
    if ((by_name and not gstore) or (by_name_grp and ARGV[o + 6] ~= '')) and
        prio == DEF_PRIO and maxr == DEF_MAXR and ARGV[o + 5] ~= '' then
      if by_name_grp and wk == 'eid' then
        redis.call('HSET', rk, 'name', ARGV[o + 1], 'args', ARGV[o + 2], 'enq', nows,
          'status', status, wk, wv, 'grp', ARGV[o + 6], 'dflt', ARGV[o + 5])
      else
        if by_name_grp then wk, wv = 'grp', ARGV[o + 6] end
        redis.call('HSET', rk, 'name', ARGV[o + 1], 'args', ARGV[o + 2], 'enq', nows,
          'status', status, wk, wv, 'dflt', ARGV[o + 5])
      end
    else
      if at then
        h = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
        for j = 1, ncopy, 2 do
          local v = ARGV[o + copy[j]]
          if v ~= '' then h[k + 1] = copy[j + 1]; h[k + 2] = v; k = k + 2 end
        end
        local expires = at_exp and tonumber(ARGV[o + at_exp]) or 0
        if expires > 0 then
          now = now or tonumber(nows)
          h[k + 1] = 'exp'; h[k + 2] = string.format('%d', now + expires); k = k + 2
        end
        if idem ~= '' then
          h[k + 1] = 'idem'; h[k + 2] = idem; k = k + 2
          redis.call('SET', KEYS[4] .. idem, tid)
        end
      elseif by_name and ARGV[o + 5] ~= '' then
        h, k = {'dflt', ARGV[o + 5]}, 2
      end
      if gstore then
        if h == NONE then h = {nil, nil, nil, nil, nil, nil} end
        h[k + 1] = 'grp'; h[k + 2] = gstore; k = k + 2
      end
      -- The record is written by one HSET (each redis.call has a cost; see docs/performance.md).
      -- Fields at their defaults are left out (attempt, retries and intr are 0 here): a smaller
      -- record costs every later step less (docs/performance.md, "A record without its defaults").
      if prio ~= DEF_PRIO or maxr ~= DEF_MAXR then
        if h == NONE then h = {nil, nil, nil, nil, nil, nil} end
        if prio ~= DEF_PRIO then h[k + 1] = 'prio'; h[k + 2] = prio; k = k + 2 end
        if maxr ~= DEF_MAXR then h[k + 1] = 'maxr'; h[k + 2] = maxr; k = k + 2 end
      end
      redis.call('HSET', rk, 'name', ARGV[o + 1], 'args', ARGV[o + 2], 'enq', nows,
        'status', status, wk, wv, unpack(h, 1, k))
    end
    if batch then
      local b = batch[status]
      b[1][#b[1] + 1] = tid
      b[2][#b[2] + 1] = '0'
    elseif not emitted then
      emit(KEYS[2], maxlen, 'enqueued', tid, '0', '', status)
    end
    made = made + 1
  end
  if n == 1 then
    -- The history: one INCR, the cheapest counter Redis has (a BITFIELD into the hour's string
    -- cost a single enqueue about twice as much: docs/operations.md, "History").
    if made == 1 and ARGV[3] ~= '0' and redis.call('INCR', KEYS[5]) == 1 then
      redis.call('EXPIRE', KEYS[5], ARGV[3])
    end
    return {tid, status, created}
  end
  if not out then out = {} end
  out[i * 3 + 1] = tid  -- (placed by index: out[#out + 1] searches the table's length)
  out[i * 3 + 2] = status
  out[i * 3 + 3] = created
end
if npushed > 0 then
  redis.call('RPUSH', group_base(KEYS[3]) .. 'w:' .. wl, unpack(pushed, 1, npushed))
end
if gidx and gidx[1] then redis.call('ZADD', group_base(KEYS[3]) .. 'idx', 'NX', unpack(gidx)) end
if batch then
  for _, st in ipairs({'queued', 'scheduled'}) do
    emit_batch(KEYS[2], maxlen, 'enqueued', batch[st][1], batch[st][2], '', st)
  end
end
if made > 0 and ARGV[3] ~= '0' and redis.call('INCRBY', KEYS[5], made) == made then
  redis.call('EXPIRE', KEYS[5], ARGV[3])
end
return out or {}
