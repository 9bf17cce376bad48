-- Remove a delivered entry from the stream and its group's pending list.
local function drop_entry(stream_key, group, eid)
  redis.call('XACK', stream_key, group, eid)
  redis.call('XDEL', stream_key, eid)
end
