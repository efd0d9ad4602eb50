-- Take the next turn number of an idle run.
-- KEYS: run record. ARGV: now.
-- Returns {turn, previous status}, {-1, ''} for an unknown run, {-2, current turn} for a
-- busy one, {-3, status} for a finished one and {-3, 'ending'} for one asked to end
-- (request_end.lua) that its worker has not torn down yet.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1, ''} end
if FINISHED[status] then return {-3, status} end
local asked = redis.call('HGET', KEYS[1], 'end_requested_at')
if asked and asked ~= '' then return {-3, 'ending'} end
if IN_FLIGHT[status] then return {-2, redis.call('HGET', KEYS[1], 'current_turn') or ''} end
if not move(KEYS[1], 'begin', ARGV[1]) then return {-2, ''} end
local turn = redis.call('HINCRBY', KEYS[1], 'turns', 1)
redis.call('HSET', KEYS[1], 'current_turn', turn)
return {turn, status}
