-- Revoke a run's credential if it was issued for the given turn or an earlier one: the end of
-- a turn never revokes the token of a turn begun after it (worker/store/credentials.py).
-- KEYS: the run's credential. ARGV: turn. Returns 1 when it was revoked.
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local turn = tonumber(string.match(held, '^(%d+) '))
if turn and turn > tonumber(ARGV[1]) then return 0 end
return redis.call('DEL', KEYS[1])
