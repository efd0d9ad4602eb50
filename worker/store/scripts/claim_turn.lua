-- Take a turn: the started mark and the owner's heartbeat are set together or not at all, so
-- a Redis error between the two cannot make a turn that never ran look like a lost one. A mark
-- holding our own token is our earlier claim whose reply was lost (the delivery was retried);
-- any other mark (another worker's claim, or a turn ended before any worker took it) refuses.
-- KEYS: started mark, owner heartbeat. ARGV: token, mark TTL, heartbeat TTL (seconds).
local token = redis.call('GET', KEYS[1])
if token and token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
return 1
