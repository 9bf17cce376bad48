-- include: record_defaults
-- Streams are passed as KEYS[1..10] for priorities 9..0.
-- (A table for the digits: tonumber parses with strtod, at a cost on every hot-path call.)
local STREAM_INDEX = {['9'] = 1, ['8'] = 2, ['7'] = 3, ['6'] = 4, ['5'] = 5, ['4'] = 6,
  ['3'] = 7, ['2'] = 8, ['1'] = 9, ['0'] = 10}
local function stream_index(prio)
  return STREAM_INDEX[prio or DEF_PRIO] or 10 - tonumber(prio)
end
