-- The first turn's run leaves "starting" once a worker has its sandbox (never after an end),
-- and records where that sandbox is in the same step.
-- KEYS: run record. ARGV: now, then field, value pairs (written while the record exists).
-- Returns 1 when it changed the status.
local moved = 0
if move(KEYS[1], 'sandbox-ready', ARGV[1]) then moved = 1 end
if #ARGV > 1 and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
end
return moved
