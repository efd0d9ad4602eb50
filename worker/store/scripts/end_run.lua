-- The run is torn down (or given up on): status "ended", with the record's other changes.
-- A turn still in flight ends with the run: when the run's current turn has no terminal yet,
-- its terminal is written here, in the same script ('turn-started' first when the turn has
-- no entry). So the record never says ended while a turn of the run still waits for its
-- terminal, and a reader that sees the run ended has every event of the run once it has read
-- to the stream's end (worker/store/stream_end.py). A worker still running that turn finds
-- it ended: its later events are dropped and its hold is lost. A turn no worker took gets
-- the started mark an 'unclaimed' end sets (end_turn.lua), so no claim takes it later.
-- A record that is gone stays gone.
-- KEYS: run record, run stream, the current turn's started mark.
-- ARGV: now, the current turn as the caller read it ('0': none), stream MAXLEN, mark TTL,
--   ts, turn-started data, terminal type, terminal data, then field, value pairs.
-- Returns the status it left, '' when it was already ended or is gone, or '!turn' when the
-- run's current turn is not ARGV[2] (one was begun since it was read: read it again).
local status = redis.call('HGET', KEYS[1], 'status')
if not status or not TRANSITIONS['end'].leaves[status] then return '' end
local turn = redis.call('HGET', KEYS[1], 'current_turn') or '0'
if turn == '' then turn = '0' end
if turn ~= ARGV[2] then return '!turn' end
if IN_FLIGHT[status] and turn ~= '0' then
  local next_seq = next_seq_of(KEYS[2], turn)
  if next_seq then
    if redis.call('EXISTS', KEYS[3]) == 0 then
      redis.call('SET', KEYS[3], 'ended-unclaimed', 'EX', ARGV[4])
    end
    append_terminal(KEYS[2], turn, next_seq, ARGV[3], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
  end
end
move(KEYS[1], 'end', ARGV[1])
if #ARGV > 8 then redis.call('HSET', KEYS[1], unpack(ARGV, 9)) end
return status
