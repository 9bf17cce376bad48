-- The history's counters (layout: dtq/stats.py): hist_add adds by_slot[slot] (what one call
-- counted; slot 1 succeeded, 2 failed, 3 retried, 4 cancelled, 5.. the run-time buckets; 0,
-- enqueued, is enqueue.lua's own key) to the minute of now (ms) in the hour string
-- <hist_base><hour>, in ONE BITFIELD. The first count of a minute (the key may be new) sets the
-- key's expiry, ttl (text, s) after its hour ends: about one EXPIREAT a minute, not one a call.
-- ttl nil, '' or '0': no history. (A counter wraps past 2^32 - 1 in a minute.)
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
