-- Give a slot back (or stop waiting for one).
-- KEYS: holders, waiting, who, seen. ARGV: member. Returns 1 when it held a slot.
local held = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return held
