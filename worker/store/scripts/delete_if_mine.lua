-- Drop a key only while it still holds our value (another worker may have refreshed it).
-- KEYS: the key. ARGV: the value we set. Returns 1 when it was deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
