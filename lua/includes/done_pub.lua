-- include: nkeys
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
