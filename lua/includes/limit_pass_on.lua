-- include: limit_unpark
-- A released task (field lown) ended without starting (cancelled, or expired at its claim):
-- the place it was owed goes to the next parked task of key lk, while the limit (lc) has room,
-- with limit_release's budget. The caller deletes lown with the status change.
local function limit_pass_on(lim_base, base, streams, lk, lc)
  local c = tonumber(lc or '0')
  if not lk or c <= 0 or redis.call('ZCARD', lim_base .. lk .. ':run') >= c then return end
  local _, more = limit_unpark(lim_base, lk, base, streams, 1, 200)
  if more == 1 then redis.call('SADD', lim_base .. '~owed', lk) end
end
