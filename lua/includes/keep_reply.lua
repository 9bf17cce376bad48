-- Keep reply for a re-send of this call for ttl_ms (text); returns reply.
local function keep_reply(reply_key, ttl_ms, reply)
  if reply_key then redis.call('SET', reply_key, cjson.encode(reply), 'PX', ttl_ms) end
  return reply
end
