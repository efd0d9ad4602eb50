-- Give back the number of a turn that was begun and never sent (the broker refused it): the
-- run is idle again and its next turn takes the same number. Only while no worker took it.
-- KEYS: run record, the turn's started mark, its queued entry. ARGV: turn, now.
-- Returns 1 when the turn was given back.
if redis.call('HGET', KEYS[1], 'current_turn') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'turns') ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if not move(KEYS[1], 'unbegin', ARGV[2]) then return 0 end
local previous = tonumber(ARGV[1]) - 1
redis.call('HSET', KEYS[1], 'turns', previous, 'current_turn', previous)
redis.call('DEL', KEYS[3])
return 1
