-- The first turn's run leaves "starting" once a worker has its sandbox (never after an end).
-- KEYS: run record. ARGV: now. Returns 1 when it changed the status.
if move(KEYS[1], 'sandbox-ready', ARGV[1]) then return 1 end
return 0
