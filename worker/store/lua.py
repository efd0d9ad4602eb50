"""Every Lua script we run in Redis, in one place, registered and called one way.

Each script is a constant here. :func:`scripts` registers all of them on a client once
(``register_script``: EVALSHA, and the script loaded again if Redis has forgotten it) and
returns a :class:`Scripts` whose typed methods are the only way the rest of the worker calls
them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

from worker.store.keys import RedisClient, Script, Value

# Atomically take the next turn number, refusing a busy or finished run.
# KEYS: run record. ARGV: now. Returns {turn, previous status}, or {-1, ''} for an unknown run,
# {-2, current turn} for a busy one, {-3, status} for a finished one.
BEGIN_TURN = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1, ''} end
if status == 'ended' or status == 'failed' then return {-3, status} end
if status == 'starting' or status == 'running' or status == 'parked' then
  return {-2, redis.call('HGET', KEYS[1], 'current_turn') or ''}
end
local turn = redis.call('HINCRBY', KEYS[1], 'turns', 1)
redis.call('HSET', KEYS[1], 'status', 'running', 'current_turn', turn, 'updated_at', ARGV[1])
return {turn, status}
"""

# Write the turn's facts and add its usage to the totals (cost stays empty until a harness
# prices something), then mark the turn finished if it is still the run's current turn and
# the run is not ended. A record that is gone (expired, deleted) is left gone: writing to it
# would leave a partial hash behind.
# KEYS: run record. ARGV: turn, status, now, input, output, cached input tokens, cost ('' when
# unpriced), then field, value pairs. Returns 1 when the turn was the current one, else 0.
FINISH_TURN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if #ARGV > 7 then redis.call('HSET', KEYS[1], unpack(ARGV, 8)) end
redis.call('HINCRBY', KEYS[1], 'input_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'output_tokens', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'cached_input_tokens', ARGV[6])
if ARGV[7] ~= '' then
  local cost = redis.call('HGET', KEYS[1], 'cost_usd')
  if not cost or cost == '' then
    redis.call('HSET', KEYS[1], 'cost_usd', ARGV[7])
  else
    redis.call('HINCRBYFLOAT', KEYS[1], 'cost_usd', ARGV[7])
  end
end
local current = redis.call('HGET', KEYS[1], 'current_turn')
if current ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'running' or status == 'starting' or status == 'parked' then
  redis.call('HSET', KEYS[1], 'status', ARGV[2])
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
return 1
"""

# The first turn's run leaves "starting" once a worker has its sandbox (never after an end).
# KEYS: run record. ARGV: now. Returns 1 when it changed the status.
MARK_RUNNING = """
if redis.call('HGET', KEYS[1], 'status') == 'starting' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[1])
  return 1
end
return 0
"""

# Take a turn: the started mark and the owner's heartbeat are set together or not at all, so
# a Redis error between the two cannot make a turn that never ran look like a lost one. A mark
# holding our own token is our earlier claim whose reply was lost (the delivery was retried).
# KEYS: started mark, owner heartbeat. ARGV: token, mark TTL, heartbeat TTL (seconds).
CLAIM_TURN = """
local token = redis.call('GET', KEYS[1])
if token and token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
return 1
"""

# Drop a key only while it still holds our value (another worker may have refreshed it).
# KEYS: the key. ARGV: the value we set. Returns 1 when it was deleted.
DELETE_IF_MINE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Park a run (worker/spend/parking.py): its limited turn sends its input again as the next turn.
# Begins that turn (turns + 1, current_turn) with the run parked until ARGV[2], counts the
# park. Only for the run's current turn, still in flight.
# KEYS: run record. ARGV: turn, resume_at, now. Returns the next turn's number, or 0.
PARK_TURN = """
if redis.call('HGET', KEYS[1], 'current_turn') ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'running' and status ~= 'starting' then return 0 end
local turn = redis.call('HINCRBY', KEYS[1], 'turns', 1)
local parks = tonumber(redis.call('HGET', KEYS[1], 'parks') or '') or 0
redis.call('HSET', KEYS[1], 'current_turn', turn, 'status', 'parked', 'resume_at', ARGV[2],
  'parks', parks + 1, 'updated_at', ARGV[3])
return turn
"""

# The parked run's turn was taken by a worker: the run is running again.
# KEYS: run record. ARGV: turn, now. Returns 1 when it was parked on that turn.
RESUME_TURN = """
if redis.call('HGET', KEYS[1], 'status') ~= 'parked' then return 0 end
if redis.call('HGET', KEYS[1], 'current_turn') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'resume_at', '', 'updated_at', ARGV[2])
return 1
"""

# Take a concurrency slot of one credential (worker/spend/slots.py), fairly across producers.
# KEYS: holders (zset: member -> lapses at), waiting (zset: member -> first asked), who (hash:
# member -> producer), seen (hash: member -> last asked). ARGV: member, producer, limit, now,
# hold backstop (s), forget a waiter silent this long (s).
# Returns {1, 0, waiting} when the member holds a slot, else {0, its place (1 is next), waiting}.
SLOT_TAKE = """
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
"""

# Give a slot back (or stop waiting for one).
# KEYS: holders, waiting, who, seen. ARGV: member. Returns 1 when it held a slot.
SLOT_RELEASE = """
local held = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return held
"""

# The holders of one credential's slots with when each hold lapses.
# KEYS: holders. Returns {member, lapses at, ...}.
SLOT_HOLDERS = """
return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
"""

# Append a batch of a turn's events to the run's stream (worker/store/publisher.py), in order: one
# command for the batch instead of one XADD each (a sixth of the client's CPU per event; the
# server's work is the same XADDs). An id the stream already has is an entry an earlier try
# stored (its reply was lost): skipped, and counted as stored. Any other error stops the batch
# (the entries before it stay) and is returned.
# KEYS: the stream. ARGV: MAXLEN (approximate), then id, type, data, ts of each entry.
# Returns the number of entries of the batch the stream now holds.
XADD_BATCH = """
local stored = 'equal or smaller than the target stream top item'
for i = 2, #ARGV, 4 do
  local reply = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], ARGV[i],
    'type', ARGV[i + 1], 'data', ARGV[i + 2], 'ts', ARGV[i + 3])
  if type(reply) == 'table' and reply.err
      and not string.find(tostring(reply.err), stored, 1, true) then
    return reply
  end
end
return (#ARGV - 1) / 4
"""

SOURCES: dict[str, str] = {
    "begin_turn": BEGIN_TURN,
    "finish_turn": FINISH_TURN,
    "mark_running": MARK_RUNNING,
    "claim_turn": CLAIM_TURN,
    "delete_if_mine": DELETE_IF_MINE,
    "park_turn": PARK_TURN,
    "resume_turn": RESUME_TURN,
    "slot_take": SLOT_TAKE,
    "slot_release": SLOT_RELEASE,
    "slot_holders": SLOT_HOLDERS,
    "xadd_batch": XADD_BATCH,
}


class Scripts:
    """Every script of :data:`SOURCES`, registered on one client."""

    def __init__(self, client: RedisClient) -> None:
        self._loaded: dict[str, Script] = {
            name: client.register_script(source) for name, source in SOURCES.items()
        }

    def _call(self, name: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        return self._loaded[name](keys=keys, args=args)

    def begin_turn(self, record: str, now: float) -> tuple[int, str]:
        reply = self._call("begin_turn", [record], [now])
        assert isinstance(reply, list)
        code, detail = reply
        return int(code), str(detail)

    def finish_turn(
        self,
        record: str,
        turn: int,
        status: str,
        now: float,
        tokens: tuple[int, int, int],
        cost: float | None,
        fields: dict[str, str],
    ) -> bool:
        args: list[Value] = [str(turn), status, now, *tokens]
        args.append("" if cost is None else repr(float(cost)))
        for name, value in fields.items():
            args += [name, value]
        return bool(self._call("finish_turn", [record], args))

    def mark_running(self, record: str, now: float) -> bool:
        return bool(self._call("mark_running", [record], [now]))

    def claim_turn(
        self, started: str, owner: str, token: str, started_ttl_s: int, owner_ttl_s: int
    ) -> bool:
        return bool(self._call("claim_turn", [started, owner], [token, started_ttl_s, owner_ttl_s]))

    def delete_if_mine(self, key: str, value: str) -> bool:
        return bool(self._call("delete_if_mine", [key], [value]))

    def park_turn(self, record: str, turn: int, resume_at: float, now: float) -> int:
        reply = self._call("park_turn", [record], [str(turn), repr(resume_at), now])
        assert isinstance(reply, int)
        return reply

    def resume_turn(self, record: str, turn: int, now: float) -> bool:
        return bool(self._call("resume_turn", [record], [str(turn), now]))

    def slot_take(
        self,
        holders: str,
        waiting: str,
        who: str,
        seen: str,
        member: str,
        producer: str,
        limit: int,
        now: float,
        backstop_s: float,
        forget_after_s: float,
    ) -> tuple[bool, int, int]:
        reply = self._call(
            "slot_take",
            [holders, waiting, who, seen],
            [member, producer, limit, repr(now), backstop_s, forget_after_s],
        )
        assert isinstance(reply, list)
        got, place, count = reply
        return bool(got), int(place), int(count)

    def slot_release(self, holders: str, waiting: str, who: str, seen: str, member: str) -> bool:
        return bool(self._call("slot_release", [holders, waiting, who, seen], [member]))

    def xadd_batch(
        self, stream: str, maxlen: int, entries: Sequence[tuple[str, str, str, str]]
    ) -> int:
        """Append ``entries`` (id, type, data, ts) to ``stream``; see :data:`XADD_BATCH`."""
        args: list[Value] = [maxlen]
        for entry in entries:
            args.extend(entry)
        reply = self._call("xadd_batch", [stream], args)
        assert isinstance(reply, int)
        return reply

    def slot_holders(self, holders: str) -> list[tuple[str, float]]:
        reply = self._call("slot_holders", [holders], [])
        assert isinstance(reply, list)
        return [(str(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


_registered: weakref.WeakKeyDictionary[RedisClient, Scripts] = weakref.WeakKeyDictionary()
_registered_lock = threading.Lock()


def scripts(client: RedisClient) -> Scripts:
    """The scripts registered on ``client``, registered on its first use."""
    with _registered_lock:
        found = _registered.get(client)
        if found is None:
            found = _registered[client] = Scripts(client)
        return found
