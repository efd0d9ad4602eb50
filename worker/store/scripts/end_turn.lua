-- End a turn, once: its terminal event and its record are written together, by a caller that
-- may end it. The one writer of every terminal (worker/turn/life.py, end_turn).
--
-- Who may end a turn (ARGV[2]):
--   'owner:' .. token: the worker that claimed it (the started mark holds that token, and is
--     deleted once the terminal is written);
--   'unclaimed': anyone, while no worker took the turn (no started mark): a mark saying so
--     is set, and no later claim can take it;
--   'lost': anyone, when a worker took it and its heartbeat is gone;
--   'outsider': anyone, in either case.
-- The turn must have no terminal yet. Its entries continue the turn's stream: a turn with no
-- entry gets its turn-started first (ARGV[8]).
--
-- KEYS: run record, run stream, started mark, owner heartbeat.
-- ARGV: turn, caller, move (finish-idle, finish-failed, finish-parked), now, stream MAXLEN,
--   mark TTL, ts, turn-started data, terminal type, terminal data, input tokens, output
--   tokens, cached input tokens, cost ('' when unpriced), then record field, value pairs.
-- An owner that finds its turn ended by another (a reaper's 'lost' end, or the run's end:
-- end_run.lua; its mark still holds the owner's token, which its own end deletes) writes no
-- terminal, but what its harness spent still counts in the record (the usage arguments).
-- Returns {1, terminal id}, or {0, why}: 'ended' (it has its terminal), 'owned' (a live
-- worker holds it), 'not-owner' (the caller's claim is not the turn's), 'claimed' (an
-- 'unclaimed' caller found a worker's claim), 'queued' (a 'lost' caller found no claim).
-- A stream of one node (a short run's few events) is written back at its size once its turn
-- ended: Redis allocates a stream's newest node at 4 KiB (stream-node-max-bytes, at most) and
-- gives the slack back only when a next node begins, which an idle run never reaches (row 10
-- of docs/performance.md). DUMP and RESTORE keep every entry, id, group and the TTL; a reader
-- blocked on the stream still gets what it waits for. Best effort, once the turn's end is
-- written (pcall): a Redis user refused DUMP or RESTORE (an @dangerous command) keeps the node.
local function compact(stream)
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'radix-tree-keys' then
      if info[i + 1] ~= 1 then return end
      local ttl = redis.call('PTTL', stream)
      redis.call('RESTORE', stream, ttl > 0 and ttl or 0, redis.call('DUMP', stream), 'REPLACE')
      return
    end
  end
end

local function count_usage()
  redis.call('HINCRBY', KEYS[1], 'input_tokens', ARGV[11])
  redis.call('HINCRBY', KEYS[1], 'output_tokens', ARGV[12])
  redis.call('HINCRBY', KEYS[1], 'cached_input_tokens', ARGV[13])
  if ARGV[14] ~= '' then
    local cost = redis.call('HGET', KEYS[1], 'cost_usd')
    if not cost or cost == '' then
      redis.call('HSET', KEYS[1], 'cost_usd', ARGV[14])
    else
      redis.call('HINCRBYFLOAT', KEYS[1], 'cost_usd', ARGV[14])
    end
  end
end

local turn = ARGV[1]
local next_seq = next_seq_of(KEYS[2], turn)
local mark = redis.call('GET', KEYS[3])
local caller = ARGV[2]
local owner = string.sub(caller, 1, 6) == 'owner:'
if not next_seq then
  if owner and mark == string.sub(caller, 7) then
    redis.call('DEL', KEYS[3])
    if redis.call('EXISTS', KEYS[1]) == 1 then count_usage() end
  end
  return {0, 'ended'}
end
if owner then
  if mark ~= string.sub(caller, 7) then return {0, 'not-owner'} end
elseif not mark then
  if caller == 'lost' then return {0, 'queued'} end
  redis.call('SET', KEYS[3], 'ended-unclaimed', 'EX', ARGV[6])
elseif caller == 'unclaimed' then
  return {0, 'claimed'}
elseif redis.call('EXISTS', KEYS[4]) == 1 then
  return {0, 'owned'}
end
local id = append_terminal(KEYS[2], turn, next_seq, ARGV[5], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
-- The owner's mark is dropped with its turn: the terminal now bars a later claim, a copy of the
-- turn's message included (claim_turn.lua), so no key is kept per turn for the retention. A
-- mark set for a turn no worker holds stays: whatever still waits to run it (a copy in the
-- queue, a wait for a concurrency slot) asks the mark.
if owner then redis.call('DEL', KEYS[3]) end
if redis.call('EXISTS', KEYS[1]) == 1 then
  if #ARGV > 14 then redis.call('HSET', KEYS[1], unpack(ARGV, 15)) end
  count_usage()
  if redis.call('HGET', KEYS[1], 'current_turn') == turn then
    move(KEYS[1], ARGV[3], ARGV[4])
  end
  redis.call('HSET', KEYS[1], 'updated_at', ARGV[4])
end
pcall(compact, KEYS[2])
return {1, id}
