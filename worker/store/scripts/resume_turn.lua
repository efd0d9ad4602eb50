-- The parked run's turn was taken by a worker: the run is running again.
-- KEYS: run record. ARGV: turn, now. Returns 1 when it was parked on that turn.
if redis.call('HGET', KEYS[1], 'current_turn') ~= ARGV[1] then return 0 end
if not move(KEYS[1], 'resume', ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'resume_at', '')
return 1
