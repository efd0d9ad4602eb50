-- Append a batch of a turn's events to the run's stream (worker/store/publisher.py), in
-- order: one command for the batch instead of one XADD each. An id the stream already has
-- counts as stored only when it is exactly the entry we send (an earlier try stored it and
-- its reply was lost); any other refusal means the turn's stream went on without us (another
-- writer ended the turn): the rest of the batch is dropped. Any other error stops the batch
-- (the entries before it stay) and is returned.
-- Only the run's first event (1-0) creates the stream: one that is gone later went with its
-- run (Redis lost it, or the run expired), and a stream made again by a late writer would
-- have no end and no expiry: the whole batch is dropped (worker/store/publisher.py).
-- KEYS: the stream. ARGV: MAXLEN (approximate), then id, type, data, ts of each entry.
-- Returns {entries handled (stored or dropped), entries dropped}.
local stored = 'equal or smaller than the target stream top item'
local total = (#ARGV - 1) / 4
if ARGV[2] ~= '1-0' and redis.call('EXISTS', KEYS[1]) == 0 then return {total, total} end
local handled = 0
for i = 2, #ARGV, 4 do
  local reply = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], ARGV[i],
    'type', ARGV[i + 1], 'data', ARGV[i + 2], 'ts', ARGV[i + 3])
  if type(reply) == 'table' and reply.err then
    if not string.find(tostring(reply.err), stored, 1, true) then return reply end
    local found = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
    local same = false
    if #found == 1 then
      local f = found[1][2]
      same = f[2] == ARGV[i + 1] and f[4] == ARGV[i + 2]
    end
    if not same then return {total, total - handled} end
  end
  handled = handled + 1
end
return {total, 0}
