-- The prefix <gb> of a queue's fair-group keys (P:{q}:g:), from its task record prefix tbase
-- (P:{q}:t:). The keys and their invariants: docs/design.md, "Fair groups and limits in the
-- scripts".
local function group_base(tbase) return string.sub(tbase, 1, -3) .. 'g:' end
