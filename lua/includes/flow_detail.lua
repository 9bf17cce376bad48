-- include: flow_public
-- The detail of a step's outcome event: "flow <flow id> step <i>".
local function flow_detail(fl)
  local id, i = flow_public(fl)
  return 'flow ' .. id .. ' step ' .. i
end
