-- Take a concurrency slot of one credential (worker/spend/slots.py), fairly across producers.
-- KEYS: holders (zset: member -> lapses at), waiting (zset: member -> first asked), who (hash:
-- member -> producer), seen (hash: member -> last asked). ARGV: member, producer, limit, now,
-- hold backstop (s), forget a waiter silent this long (s).
-- Returns {1, 0, waiting} when the member holds a slot, else {0, its place (1 is next), waiting}.
local now = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local seen = redis.call('HGETALL', KEYS[4])
for i = 1, #seen, 2 do
  if tonumber(seen[i + 1]) < now - tonumber(ARGV[6]) then
    redis.call('ZREM', KEYS[2], seen[i])
    redis.call('HDEL', KEYS[4], seen[i])
    if not redis.call('ZSCORE', KEYS[1], seen[i]) then redis.call('HDEL', KEYS[3], seen[i]) end
  end
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, 0, redis.call('ZCARD', KEYS[2])}
end
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], now)
local held = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local p = redis.call('HGET', KEYS[3], m) or ''
  held[p] = (held[p] or 0) + 1
end
local waiting = redis.call('ZRANGE', KEYS[2], 0, -1)
local rank = {}
local order = {}
for i, m in ipairs(waiting) do
  local p = redis.call('HGET', KEYS[3], m) or ''
  local k = rank[p] or held[p] or 0
  rank[p] = k + 1
  order[#order + 1] = {k, i, m}
end
table.sort(order, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local place = 0
for j, o in ipairs(order) do
  if o[3] == ARGV[1] then place = j break end
end
local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
if place >= 1 and place <= free then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[1])
  return {1, 0, #waiting - 1}
end
return {0, place, #waiting}
