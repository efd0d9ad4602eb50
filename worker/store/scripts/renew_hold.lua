-- Take a turn's owner heartbeat again after it lapsed (Redis was away, or the worker stalled,
-- for a whole TTL): only for the worker that claimed the turn (the started mark holds its
-- token) and only while the turn has not ended (a reaper that found the heartbeat gone may
-- have written its worker-lost terminal; a 'lost' end keeps the mark). Atomic against that
-- reaper's end_turn.lua: one of the two wins, and the other sees it.
-- KEYS: started mark, owner heartbeat, run stream. ARGV: token, heartbeat TTL (seconds), turn.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if turn_ended(KEYS[3], ARGV[3]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
