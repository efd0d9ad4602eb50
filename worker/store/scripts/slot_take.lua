-- Take a concurrency slot of one credential (worker/spend/slots.py), fairly across producers.
-- KEYS: holders (zset: holder -> lapses at), waiting (zset: member -> first asked), who (hash:
-- member or holder -> producer), seen (hash: member -> last asked), caps (hash: producer -> the
-- most slots it holds at once). ARGV: member, producer, limit, now, hold backstop (s), forget a
-- waiter silent this long (s), the producer's cap (0: none but the limit), holder ('' : the
-- member).
-- A turn waits by its member (its place in line is the turn's, whichever copy asks) and holds
-- by its holder, the name of the one attempt that took the slot (who['held:' .. member]): a
-- copy of the turn that loses the claim releases its own hold, never the winner's, and a copy
-- that asks while another copy of its turn holds a slot neither takes one nor waits in line.
-- A producer's waiting turn beyond its cap (counting the slots it holds) waits behind every
-- turn that may take a slot: it neither takes one nor keeps another producer's turn waiting.
-- Returns {1, 0, waiting} when the holder holds a slot, else {0, its place (1 is next; 0:
-- another copy of the turn holds a slot), waiting}.
local now = tonumber(ARGV[4])
local holder = ARGV[8]
if not holder or holder == '' then holder = ARGV[1] end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local seen = redis.call('HGETALL', KEYS[4])
for i = 1, #seen, 2 do
  if tonumber(seen[i + 1]) < now - tonumber(ARGV[6]) then
    redis.call('ZREM', KEYS[2], seen[i])
    redis.call('HDEL', KEYS[4], seen[i])
    if not redis.call('ZSCORE', KEYS[1], seen[i]) then redis.call('HDEL', KEYS[3], seen[i]) end
  end
end
if redis.call('ZSCORE', KEYS[1], holder) then
  return {1, 0, redis.call('ZCARD', KEYS[2])}
end
local copy = redis.call('HGET', KEYS[3], 'held:' .. ARGV[1])
if copy and copy ~= holder and redis.call('ZSCORE', KEYS[1], copy) then
  return {0, 0, redis.call('ZCARD', KEYS[2])}
end
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], now)
if tonumber(ARGV[7]) > 0 then
  redis.call('HSET', KEYS[5], ARGV[2], ARGV[7])
else
  redis.call('HDEL', KEYS[5], ARGV[2])
end
local caps = {}
local capped = redis.call('HGETALL', KEYS[5])
for i = 1, #capped, 2 do caps[capped[i]] = tonumber(capped[i + 1]) end
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
  local over = caps[p] ~= nil and k >= caps[p]
  order[#order + 1] = {over and 1 or 0, k, i, m}
end
table.sort(order, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[3] < b[3]
end)
local place, over = 0, 1
for j, o in ipairs(order) do
  if o[4] == ARGV[1] then place, over = j, o[1] break end
end
local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
if place >= 1 and place <= free and over == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  if holder ~= ARGV[1] then
    redis.call('HDEL', KEYS[3], ARGV[1])
    redis.call('HSET', KEYS[3], holder, ARGV[2], 'held:' .. ARGV[1], holder)
  end
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), holder)
  return {1, 0, #waiting - 1}
end
return {0, place, #waiting}
