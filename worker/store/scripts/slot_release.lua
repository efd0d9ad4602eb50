-- Give a slot back (by its holder's name) or stop waiting for one (by the turn's member).
-- KEYS: holders, waiting, who, seen. ARGV: the holder or member. Returns 1 when it held a slot.
local held = redis.call('ZREM', KEYS[1], ARGV[1])
local member = string.match(ARGV[1], '^([^/]*/[^/]*)/')
if member and redis.call('HGET', KEYS[3], 'held:' .. member) == ARGV[1] then
  redis.call('HDEL', KEYS[3], 'held:' .. member)
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return held
