-- The run is torn down (or given up on): status "ended", with the record's other changes.
-- A record that is gone stays gone. KEYS: run record. ARGV: now, then field, value pairs.
-- Returns the status it left, or '' when it was already ended or is gone.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return '' end
if not move(KEYS[1], 'end', ARGV[1]) then return '' end
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
return status
