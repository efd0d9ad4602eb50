-- Park a run (worker/spend/parking.py): its limited turn sends its input again as the next
-- turn. Begins that turn (turns + 1, current_turn) with the run parked until ARGV[2], counts
-- the park. Only for the run's current turn, still in flight.
-- KEYS: run record. ARGV: turn, resume_at, now. Returns the next turn's number, or 0.
if redis.call('HGET', KEYS[1], 'current_turn') ~= ARGV[1] then return 0 end
if not move(KEYS[1], 'park', ARGV[3]) then return 0 end
local turn = redis.call('HINCRBY', KEYS[1], 'turns', 1)
local parks = tonumber(redis.call('HGET', KEYS[1], 'parks') or '') or 0
redis.call('HSET', KEYS[1], 'current_turn', turn, 'resume_at', ARGV[2], 'parks', parks + 1)
return turn
