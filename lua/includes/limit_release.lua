-- include: limit_unpark
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
