-- The holders of one credential's slots with when each hold lapses.
-- KEYS: holders. Returns {member, lapses at, ...}.
return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
