-- Take a turn: the started mark and the owner's heartbeat are set together or not at all, so
-- a Redis error between the two cannot make a turn that never ran look like a lost one. A mark
-- holding our own token is our earlier claim whose reply was lost (the delivery was retried);
-- any other mark (another worker's claim, or a turn ended before any worker took it) refuses.
-- So does a turn that has ended: its terminal is in the stream, or a later turn has begun
-- (which only an ended turn allows; the stream may have been trimmed past its terminal since).
-- Its owner drops the mark when it ends the turn (end_turn.lua), so these say it instead.
-- A claim also takes the turn's queued entry (it is no longer waiting: nothing may send it
-- again) and says whether a cancel of the turn is already marked, the two things a claimed
-- turn asks first, in the same round trip.
-- KEYS: started mark, owner heartbeat, run stream, run record, queued entry, cancel mark.
-- ARGV: token, mark TTL, heartbeat TTL (seconds), turn.
-- Reply: 0 refused; else {1, the queued entry (false when gone), 1 when cancelled else 0}.
local token = redis.call('GET', KEYS[1])
if token and token ~= ARGV[1] then return 0 end
local turn = ARGV[4]
if turn_ended(KEYS[3], turn) then return 0 end
if (tonumber(redis.call('HGET', KEYS[4], 'turns')) or 0) > tonumber(turn) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
local entry = redis.call('GET', KEYS[5])
if entry then redis.call('DEL', KEYS[5]) end
return {1, entry, redis.call('EXISTS', KEYS[6])}
