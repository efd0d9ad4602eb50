-- Answer a permission request, first answer wins (worker/permissions/requests.py).
-- KEYS: the requests hash, the answers hash. ARGV: request id, the answer (JSON), now (unix
-- time), "1" when the worker closes the request (its deadline does not apply).
-- Returns {status, detail}: ok, unknown, answered (detail: the answer that won), expired
-- (detail: the request).
local request = redis.call('HGET', KEYS[1], ARGV[1])
if not request then return {'unknown', ''} end
local prior = redis.call('HGET', KEYS[2], ARGV[1])
if prior then return {'answered', prior} end
if ARGV[4] ~= '1' then
  local deadline = tonumber(cjson.decode(request)['deadline'])
  if deadline and tonumber(ARGV[3]) > deadline then return {'expired', request} end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {'ok', ''}
