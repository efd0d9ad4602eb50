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

from worker.keys import RedisClient, Script, Value

# Atomically take the next turn number, refusing a busy or finished run.
# KEYS: run record. ARGV: now. Returns {turn, previous status}, or {-1, ''} for an unknown run,
# {-2, current turn} for a busy one, {-3, status} for a finished one.
BEGIN_TURN = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1, ''} end
if status == 'ended' or status == 'failed' then return {-3, status} end
if status == 'starting' or status == 'running' then
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
if status == 'running' or status == 'starting' then
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

SOURCES: dict[str, str] = {
    "begin_turn": BEGIN_TURN,
    "finish_turn": FINISH_TURN,
    "mark_running": MARK_RUNNING,
    "claim_turn": CLAIM_TURN,
    "delete_if_mine": DELETE_IF_MINE,
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


_registered: weakref.WeakKeyDictionary[RedisClient, Scripts] = weakref.WeakKeyDictionary()
_registered_lock = threading.Lock()


def scripts(client: RedisClient) -> Scripts:
    """The scripts registered on ``client``, registered on its first use."""
    with _registered_lock:
        found = _registered.get(client)
        if found is None:
            found = _registered[client] = Scripts(client)
        return found
