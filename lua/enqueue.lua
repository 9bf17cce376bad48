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
-- ARGV[4..]    per task, 14 fields: 5 always given: tid, name, args(JSON), priority(0-9),
--              max_retries (a number; or "~<letters><number>" when the enqueue left some of
--              max_retries/timeout/expires to the worker's declaration: the letters, of "mte",
--              are stored as the record's "dflt" (dtq/declared.py); the number is stored as
--              maxr either way, dtq's default where "m" is among the letters, so a worker that
--              does not know "dflt" reads the record as before); then 9 options: kwargs(JSON or
--              ''), timeout_s('' = none),
--              delay_ms(0 = now), expires_ms(0 = never, relative to now), idempotency key
--              ('' = none), meta(JSON or ''), limit ('' = none, else
--              "concurrency|rate count|rate window ms|key", dtq/limits.py), headers (JSON
--              object of strings set by middleware, e.g. a W3C traceparent, or ''; stored as
--              field hdr and handed to the worker in the claim reply), group ('' = none; its
--              fair group, field grp: docs/groups.md).
--              When no task of the call has an option, each sends its 5 fields only (the
--              call has 3 + 5n arguments: a bulk enqueue of plain tasks sends 5 per task, not
--              14, and a single one 7, not 16; each argument costs Redis a Lua string). When
--              a group is the only option any task of the call has, each sends 6: its 5 and
--              its group ('' = none; 3 + 6n arguments). Else the last task may stop after its
--              5 fields when its 9 options are empty.
-- Returns      flat list, 3 per task: tid, status, created(1) | existing(0)
--              For an idempotency key that names a live task, that task's tid and status.
--              A task whose record exists already was made by this very call, sent before:
--              tids are random and made per enqueue, so that is a client's re-send after the
--              connection lost the reply. It is answered with its status now and created(1),
--              and nothing is written again (no second stream entry, no second event).
--
-- The call's time ("enq", and what delays and expiry count from) is read once: from the first
-- stream entry's id (its milliseconds are the server's clock), or by TIME when a scheduled task
-- comes first (TIME is a call of its own: a tenth of a single enqueue's cost).
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
local F = 14  -- fields per task; 5 when no task of the call has options, 6 with groups only
if #ARGV == 3 + 5 * n then F = 5 elseif #ARGV == 3 + 6 * n then F = 6 end
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
    if ARGV[7 + i * F] ~= band then bad = ARGV[7 + i * F]; break end
  end
else
  streams = {}
  for i = 6, nk do streams[string.sub(KEYS[i], -1)] = KEYS[i] end
  for i = 0, n - 1 do
    if not streams[ARGV[7 + i * F]] then bad = ARGV[7 + i * F]; break end
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
local gmode = nil  -- whether the queue has active groups (read once, at the first plain task)
-- A bulk call's new groups enter the index of active groups by one ZADD, at the end: their
-- entries (score, group, ...) as group_put collects them.
local gidx = n > 1 and {} or nil
-- The tasks of one call that follow a task of the same group and band wait in that group's
-- list (group_put made it, and it has the turn): they are appended by one RPUSH (pushed),
-- at the next task of another list and at the end. wl: that list's "<band>:<group>". (No
-- table or function is made for it before a bulk call's second task of a group: a plain
-- single enqueue pays nothing.)
local wl, pushed, npushed = nil, nil, 0
for i = 0, n - 1 do
  local o = 4 + i * F
  local tid, prio = ARGV[o], ARGV[o + 3]
  local opts = F == 14 and ARGV[o + 5] ~= nil  -- the 9 options were sent
  local g6 = F == 6 and ARGV[o + 5] ~= '' and ARGV[o + 5] or nil  -- the group, the 6th field
  local delay, idem = 0, ''
  if opts then delay, idem = tonumber(ARGV[o + 7]), ARGV[o + 9] end
  local status, created = nil, 1
  if idem ~= '' then  -- an idempotency key naming a live task answers with that task
    local prev = redis.call('GET', KEYS[4] .. idem)
    if prev then
      status = redis.call('HGET', KEYS[3] .. prev, 'status')
      if status and prev ~= tid then tid, created = prev, 0 end  -- (prev == tid: a re-send)
    end
  end
  local rk = KEYS[3] .. tid
  if not status then status = redis.call('HGET', rk, 'status') end  -- set: a re-send (above)
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
      local grp = g6 or opts and ARGV[o + 13] or ''
      if grp == '' and gmode == nil then  -- (a new group of this call: active, not indexed yet)
        gmode = gidx ~= nil and gidx[1] ~= nil or
          redis.call('EXISTS', group_base(KEYS[3]) .. 'idx') == 1
      end
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
            gidx)
          gstore = store
          if eid then wk, wv = 'eid', eid else wk, wv = 'status', status end
          if n > 1 then wl = l end
        end
      else
        wk, wv = 'eid', redis.call('XADD', sk, '*', 't', tid)
      end
      if not nows then  -- the id's milliseconds (a plain find: cheaper than a pattern)
        if wk == 'eid' then
          nows = string.sub(wv, 1, string.find(wv, '-', 1, true) - 1)
        else
          now, nows = now_ms()
        end
      end
    end
    local h = NONE  -- the record's optional fields
    local maxr, dflt = ARGV[o + 4], nil
    if string.byte(maxr) == 126 then  -- '~': some values are left to the declaration
      dflt, maxr = string.match(maxr, '^~(%l+)(%d+)$')
      h = {'dflt', dflt}
    elseif opts then
      h = {}
    end
    if opts then
      local kwargs, timeout, expires = ARGV[o + 5], ARGV[o + 6], tonumber(ARGV[o + 8])
      local meta, lim, hdr, grp = ARGV[o + 10], ARGV[o + 11], ARGV[o + 12], ARGV[o + 13]
      if kwargs ~= '' then h[#h + 1] = 'kwargs'; h[#h + 1] = kwargs end
      if timeout ~= '' then h[#h + 1] = 'timeout'; h[#h + 1] = timeout end
      if expires > 0 then
        now = now or tonumber(nows)
        h[#h + 1] = 'exp'; h[#h + 1] = now + expires
      end
      if meta ~= '' then h[#h + 1] = 'meta'; h[#h + 1] = meta end
      if hdr ~= '' then h[#h + 1] = 'hdr'; h[#h + 1] = hdr end
      if grp and grp ~= '' then h[#h + 1] = 'grp'; h[#h + 1] = grp end
      if lim ~= '' then
        local lc, lrn, lrw, lk = string.match(lim, '^(%d+)|(%d+)|(%d+)|(.*)$')
        for _, v in ipairs({'lk', lk, 'lc', lc, 'lrn', lrn, 'lrw', lrw}) do h[#h + 1] = v end
      end
      if idem ~= '' then
        h[#h + 1] = 'idem'; h[#h + 1] = idem
        redis.call('SET', KEYS[4] .. idem, tid)
      end
    end
    if g6 then
      if h == NONE then h = {} end
      h[#h + 1] = 'grp'; h[#h + 1] = g6
    end
    if gstore then
      if h == NONE then h = {} end
      h[#h + 1] = 'grp'; h[#h + 1] = gstore
    end
    -- The record is written by one HSET (each redis.call has a cost; see docs/performance.md).
    -- Fields at their defaults are left out (attempt, retries and intr are 0 here): a smaller
    -- record costs every later step less (docs/performance.md, "A record without its defaults").
    if prio ~= DEF_PRIO or maxr ~= DEF_MAXR then
      if h == NONE then h = {} end
      if prio ~= DEF_PRIO then h[#h + 1] = 'prio'; h[#h + 1] = prio end
      if maxr ~= DEF_MAXR then h[#h + 1] = 'maxr'; h[#h + 1] = maxr end
    end
    redis.call('HSET', rk, 'name', ARGV[o + 1], 'args', ARGV[o + 2], 'enq', nows,
      'status', status, wk, wv, unpack(h))
    if batch then
      local b = batch[status]
      b[1][#b[1] + 1] = tid
      b[2][#b[2] + 1] = '0'
    else
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
