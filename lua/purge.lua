-- purge.lua: remove up to LIMIT waiting tasks of one queue, with their records and idempotency
-- keys: first the queued entries no worker has taken yet (those after the group's
-- last-delivered id), then the scheduled tasks (delays and retries), then the tasks parked
-- behind a concurrency limit (the held lists named in <lim:>~parked), then the tasks waiting in
-- their fair group's lists (found through the active groups, docs/groups.md). Running tasks, finished
-- records and the dead-letter queue are never touched. Called repeatedly until it reports no
-- more, so each call stays short however long the queue is.
--
-- KEYS[1..10]  priority streams p9..p0
-- KEYS[11]     P:{q}:sched
-- KEYS[12]     P:{q}:events
-- KEYS[13]     P:{q}:t:      (task record key prefix)
-- KEYS[14]     P:{q}:idem:
-- KEYS[15]     P:{q}:lim:    (prefix: <lim:>k:held lists, the set <lim:>~parked, docs/limits.md)
-- ARGV[1]      consumer group
-- ARGV[2]      limit: most entries/tasks/held lists examined in this call (>= 1)
-- ARGV[3]      events maxlen
-- KEYS[16]     P:{q}:reply:<nonce> (optional): this call's kept reply, for its re-send
-- ARGV[4]      done channel prefix (waiters of a purged task are woken with 'purged')
-- ARGV[5]      how long the reply is kept for a re-send (ms; with KEYS[16])
-- KEYS[17..18] P:{q}:f:, P:{q}:flowq (optional, with KEYS[16]): a purged workflow step ends
--              its flow "cancelled" in this same call (includes/flow_note.lua: in place when
--              the flow is homed here, else a note in this queue's outbox)
-- ARGV[6]      TTL (s) of a flow that ends here (with KEYS[17])
-- Returns      {queued removed, scheduled removed, more (1 when the limit was reached)}
--              A re-send of a call (same nonce) gets the first send's reply and changes nothing
--              (see includes/replayed.lua): the counts stay those of the batch it removed.
--
-- include: done_pub
-- include: emit
-- include: flow_note
-- include: group_base
-- include: group_heads
-- include: group_issue
-- include: group_settle
-- include: keep_reply
-- include: limit_pass_on
-- include: replayed

local group, limit, maxlen, done_prefix = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local base, idem_base = KEYS[13], KEYS[14]
local seen, nq, ns = 0, 0, 0
local reply_key = KEYS[16]
local again = replayed(reply_key)
if again then return again end

local flow_k = nil  -- the flows' K (flow_note), made at the first purged workflow step
local function flow_purged(fl)
  if not KEYS[17] then return end
  flow_k = flow_k or {streams = KEYS, sched = KEYS[11], events = KEYS[12], tbase = base,
    fbase = KEYS[17], flowq = KEYS[18], maxlen = maxlen, ttl = ARGV[6],
    done_prefix = done_prefix}
  flow_note(flow_k, fl, 'cancelled', 'purged')
end

-- The limit places of purged tasks that had been released for one (lown): passed on at the end
-- of the call, after the parked and the group-listed tasks were purged. Passed on at once, the
-- place released a parked task into its group mid-call, and the group pass then took it off its
-- list with its new entry (a stream entry without the turn).
local owed = {}

local function forget(tid)
  local rk = base .. tid
  local r = redis.call('HMGET', rk, 'idem', 'flow', 'lown', 'lk', 'lc')
  local idem = r[1]
  if idem and idem ~= '' and redis.call('GET', idem_base .. idem) == tid then
    redis.call('DEL', idem_base .. idem)
  end
  redis.call('DEL', rk)
  redis.call(done_pub(), done_prefix .. tid, 'purged')
  if r[2] then flow_purged(r[2]) end
  -- A released task's place goes on, at the end of this call (pass_on below), so a purge
  -- stopped between batches strands no parked task.
  if r[3] then owed[#owed + 1] = {r[4], r[5]} end
end

-- Pop the ids of list key (up to the call's budget) and forget those still waiting there
-- (queued, no entry); a dead id is dropped all the same. Held lists and group lists alike.
local function forget_listed(key)
  for _, tid in ipairs(redis.call('LPOP', key, math.max(1, limit - seen)) or {}) do
    local r = redis.call('HMGET', base .. tid, 'status', 'eid')
    if r[1] == 'queued' and not r[2] then
      forget(tid)
      nq = nq + 1
    end
    seen = seen + 1
  end
end

-- The first id no consumer of the group has been given: '-' when the group does not exist.
local function undelivered_start(stream)
  local groups = redis.call('XINFO', 'GROUPS', stream)
  for _, g in ipairs(groups) do
    local name, last = nil, nil
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] end
      if g[j] == 'last-delivered-id' then last = g[j + 1] end
    end
    if name == group then return '(' .. last end
  end
  return '-'
end

for i = 1, 10 do
  if seen >= limit then break end
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local entries = redis.call('XRANGE', KEYS[i], undelivered_start(KEYS[i]), '+',
      'COUNT', limit - seen)
    for _, entry in ipairs(entries) do
      local eid, tid = entry[1], entry[2][2]
      local r = redis.call('HMGET', base .. tid, 'status', 'eid')
      if r[1] == 'queued' and r[2] == eid then
        forget(tid)
        nq = nq + 1
      end
      -- Not delivered yet, so no pending list holds it; an entry whose record moved on is a
      -- duplicate the claim would absorb anyway.
      redis.call('XDEL', KEYS[i], eid)
      seen = seen + 1
    end
  end
end

if seen < limit then
  local due = redis.call('ZRANGE', KEYS[11], 0, limit - seen - 1)
  for _, tid in ipairs(due) do
    if redis.call('HGET', base .. tid, 'status') == 'scheduled' then
      forget(tid)
      ns = ns + 1
    end
    redis.call('ZREM', KEYS[11], tid)
    seen = seen + 1
  end
end

if seen < limit then
  -- Parked tasks: status queued, no entry; a dead id in a held list is dropped all the same.
  local index = KEYS[15] .. '~parked'
  for _, lk in ipairs(redis.call('SRANDMEMBER', index, limit - seen)) do
    if seen >= limit then break end
    local held = KEYS[15] .. lk .. ':held'
    seen = seen + 1
    forget_listed(held)
    if redis.call('LLEN', held) == 0 then redis.call('SREM', index, lk) end
  end
end

if seen < limit then
  -- Tasks waiting in their group's lists, found through the active groups (<g:>idx, in pages;
  -- a group with nothing waiting, only runs, is passed over uncounted: there are at most as
  -- many as runs). Every stream entry is purged by now, so a list's head is '~' (a withheld
  -- turn, which stays while tasks are left behind it), a purged task's id, or a waiting task
  -- whose turn's entry (group_issue's, named in no record) was purged with the stream. A group
  -- with nothing left leaves the active groups (group_settle).
  local gb = group_base(base)
  local from = 0
  while seen < limit do
    local groups = redis.call('ZRANGE', gb .. 'idx', from, from + limit - 1)
    if #groups == 0 then break end
    from = from + #groups
    for _, g in ipairs(groups) do
      if seen >= limit then break end
      local heads = group_heads(gb, g)
      local any = false
      for j = 1, 10 do
        if heads[j] and seen < limit then
          any = true
          local w = gb .. 'w:' .. (10 - j) .. ':' .. g
          if heads[j] == '~' then redis.call('LPOP', w) end
          forget_listed(w)
          if redis.call('EXISTS', w) == 1 then  -- (the budget ran out: the rest keeps a turn)
            if heads[j] == '~' then redis.call('LPUSH', w, '~')
            else group_issue(gb, KEYS, string.format('%d', 10 - j), g) end
          end
        end
      end
      if any then
        seen = seen + 1
        group_settle(gb, KEYS, g, nil, nil, true)
        if not redis.call('ZSCORE', gb .. 'idx', g) then from = from - 1 end  -- (it left)
      end
    end
  end
end

for _, o in ipairs(owed) do limit_pass_on(KEYS[15], base, KEYS, o[1], o[2]) end
if nq + ns > 0 then
  emit(KEYS[12], maxlen, 'purged', '', '', '', tostring(nq + ns))
end
local more = 0
if seen >= limit then more = 1 end
return keep_reply(reply_key, ARGV[5], {nq, ns, more})
