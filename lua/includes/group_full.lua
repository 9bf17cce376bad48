-- Whether group grp runs cap tasks or more (g:run:<group> counts its running tasks: every
-- script that starts or ends a run of the group changes it in the same call).
local function group_full(gb, grp, cap)
  return tonumber(redis.call('GET', gb .. 'run:' .. grp) or '0') >= cap
end
