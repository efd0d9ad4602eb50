-- Take a turn: the started mark and the owner's heartbeat are set together or not at all, so
-- a Redis error between the two cannot make a turn that never ran look like a lost one. A mark
-- holding our own token is our earlier claim whose reply was lost (the delivery was retried);
-- any other mark (another worker's claim, or a turn ended before any worker took it) refuses.
-- So does a turn that has ended: its terminal is in the stream, or a later turn has begun
-- (which only an ended turn allows; the stream may have been trimmed past its terminal since).
-- Its owner drops the mark when it ends the turn (end_turn.lua), so these say it instead.
-- KEYS: started mark, owner heartbeat, run stream, run record. ARGV: token, mark TTL,
-- heartbeat TTL (seconds), turn.
local token = redis.call('GET', KEYS[1])
if token and token ~= ARGV[1] then return 0 end
local turn = ARGV[4]
if turn_ended(KEYS[3], turn) then return 0 end
if (tonumber(redis.call('HGET', KEYS[4], 'turns')) or 0) > tonumber(turn) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
return 1
