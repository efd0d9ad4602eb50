-- A producer asked to end the run: from this moment it takes no more turns (begin_turn.lua
-- refuses them as 'ending'), however long its worker takes to tear it down. The asker marks
-- it first and reads its status after, so a turn begun before the mark is one the asker sees
-- in flight (and cancels), and none can be begun after it.
-- KEYS: run record. ARGV: now.
-- Returns the run's status ('' for an unknown run).
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return '' end
local asked = redis.call('HGET', KEYS[1], 'end_requested_at')
if status ~= 'ended' and (not asked or asked == '') then
  redis.call('HSET', KEYS[1], 'end_requested_at', ARGV[1])
end
return status
