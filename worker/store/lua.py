"""Every Lua script we run in Redis, registered and called one way.

Each script is a file of ``worker/store/scripts/`` (``NAME.lua``, its KEYS, ARGV and reply
described at its top). :data:`SOURCES` holds them all, each after one prelude that
defines, from the Python definitions, the run status transitions (``move``, from
:mod:`worker.store.status`), the in-flight and finished statuses and the terminal event
types. :func:`scripts` registers all of them on a client once (``register_script``: EVALSHA,
and the script loaded again if Redis has forgotten it) and returns a :class:`Scripts`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from redis.exceptions import NoScriptError

from adapters.events import TERMINAL_TYPES
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import ConnectionPool, PooledConnection, RedisClient, Script, Value
from worker.store.status import FINISHED, IN_FLIGHT, lua_prelude

SCRIPTS_DIR = Path(__file__).with_name("scripts")


def _set(name: str, members: Sequence[str]) -> str:
    items = ", ".join(f'["{member}"] = true' for member in members)
    return f"local {name} = {{{items}}}\n"


_TURN_ENDED = """local function turn_ended(stream, turn)
  local last = redis.call('XREVRANGE', stream, turn .. '-18446744073709551615', turn .. '-0',
    'COUNT', 1)
  if #last == 0 then return false end
  local fields = last[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'type' and TERMINAL[fields[i + 1]] then return true end
  end
  return false
end
"""
"""Whether the turn's last entry in the run's stream is its terminal."""

_END_TURN_STREAM = """local function next_seq_of(stream, turn)
  local last = redis.call('XREVRANGE', stream, turn .. '-18446744073709551615', turn .. '-0',
    'COUNT', 1)
  if #last == 0 then return 0 end
  local fields = last[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'type' and TERMINAL[fields[i + 1]] then return nil end
  end
  return tonumber(string.match(last[1][1], '-(%d+)$')) + 1
end
local function append_terminal(stream, turn, next_seq, maxlen, ts, header, kind, data)
  if next_seq == 0 then
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, turn .. '-0',
      'type', 'turn-started', 'data', header, 'ts', ts)
    next_seq = 1
  end
  local id = turn .. '-' .. next_seq
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, id, 'type', kind, 'data', data, 'ts', ts)
  return id
end
"""
"""A turn's end in its stream: ``next_seq_of`` the seq its terminal takes (nil when it has
its terminal already), ``append_terminal`` writes it (after a ``turn-started`` when the turn
has no entry yet)."""

PRELUDE = (
    lua_prelude()
    + _set("IN_FLIGHT", IN_FLIGHT)
    + _set("FINISHED", FINISHED)
    + _set("TERMINAL", sorted(TERMINAL_TYPES))
    + _TURN_ENDED
    + _END_TURN_STREAM
)

SOURCES: dict[str, str] = {
    path.stem: PRELUDE + path.read_text() for path in sorted(SCRIPTS_DIR.glob("*.lua"))
}


@dataclass(frozen=True)
class Claimed:
    """A turn this worker has just claimed (``claim_turn.lua``): its queued entry as the
    claim took it (None when already gone: an earlier claim of this delivery whose reply was
    lost took it), and whether a cancel of it was marked then."""

    queued: str | None
    cancelled: bool


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class Scripts:
    """Every script of :data:`SOURCES`, registered on one client; its typed methods are the
    only way the rest of the worker calls a script."""

    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self._loaded: dict[str, Script] = {
            name: client.register_script(source) for name, source in SOURCES.items()
        }

    def _call(self, name: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        return self._loaded[name](keys=keys, args=args)

    def _send(self, name: str, keys: Sequence[str], args: Sequence[Value]) -> SentCall:
        """Send a call on a connection of its own, its reply read later (:class:`SentCall`)."""
        pool = self._client.connection_pool

        def again() -> object:
            return self._call(name, keys, args)

        connection = pool.get_connection()
        try:
            connection.send_command("EVALSHA", self._loaded[name].sha, len(keys), *keys, *args)
        except REDIS_ERRORS:
            connection.disconnect()
            pool.release(connection)
            # Nothing reached Redis, or a dead connection cut it short (a retried XADD_BATCH
            # is harmless): the usual call, with the client's retry, in place.
            return SentCall(pool, None, again, self._call(name, keys, args))
        return SentCall(pool, connection, again)

    def begin_turn(self, record: str, now: float) -> tuple[int, str]:
        reply = self._call("begin_turn", [record], [now])
        assert isinstance(reply, list)
        code, detail = reply
        return int(code), str(detail)

    def request_end(self, record: str, now: float) -> str:
        """See ``request_end.lua``: the run's status ('' when unknown), marked as ending."""
        return _text(self._call("request_end", [record], [now])) or ""

    def mark_running(self, record: str, now: float, fields: dict[str, str]) -> bool:
        return bool(self._call("mark_running", [record], _now_and_pairs(now, fields)))

    def claim_turn(
        self,
        keys: tuple[str, str, str, str, str, str],
        turn: int,
        token: str,
        started_ttl_s: int,
        owner_ttl_s: int,
    ) -> Claimed | None:
        """See ``claim_turn.lua``: ``keys`` the turn's started mark and owner heartbeat, the
        run's stream and record, the turn's queued entry and cancel mark. None when refused."""
        args: list[Value] = [token, started_ttl_s, owner_ttl_s, str(turn)]
        reply = self._call("claim_turn", list(keys), args)
        if not isinstance(reply, list):
            return None
        _, entry, cancelled = reply
        return Claimed(_text(entry), bool(cancelled))

    def renew_hold(
        self, keys: tuple[str, str, str], turn: int, token: str, owner_ttl_s: int
    ) -> bool:
        """See ``renew_hold.lua``: ``keys`` the turn's started mark and owner heartbeat, the
        run's stream. False when the turn is no longer the token's to hold."""
        return bool(self._call("renew_hold", list(keys), [token, owner_ttl_s, str(turn)]))

    def revoke_credential(self, key: str, through: int) -> bool:
        """See ``revoke_credential.lua``: the credential revoked if issued for turn
        ``through`` or earlier."""
        return bool(self._call("revoke_credential", [key], [str(through)]))

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
        *,
        caps: str,
        cap: int,
        holder: str = "",
    ) -> tuple[bool, int, int]:
        """See ``slot_take.lua``; ``caps`` the hash of each producer's cap, ``cap`` this
        producer's (0: none); ``holder`` the name the slot is held by (default: ``member``)."""
        reply = self._call(
            "slot_take",
            [holders, waiting, who, seen, caps],
            [member, producer, limit, repr(now), backstop_s, forget_after_s, cap, holder],
        )
        assert isinstance(reply, list)
        got, place, count = reply
        return bool(got), int(place), int(count)

    def slot_release(self, holders: str, waiting: str, who: str, seen: str, member: str) -> bool:
        return bool(self._call("slot_release", [holders, waiting, who, seen], [member]))

    def xadd_batch(
        self, stream: str, maxlen: int, entries: Sequence[tuple[str, str, str, str]]
    ) -> tuple[int, int]:
        """Append ``entries`` (id, type, data, ts) to ``stream``: how many were handled, and
        how many of those were dropped (see ``xadd_batch.lua``)."""
        return _xadd_reply(self._call("xadd_batch", [stream], _xadd_args(maxlen, entries)))

    def send_xadd_batch(
        self, stream: str, maxlen: int, entries: Sequence[tuple[str, str, str, str]]
    ) -> SentCall:
        """:meth:`xadd_batch` without waiting: Redis runs it while the caller goes on, and
        :meth:`SentCall.reply` gives what :meth:`xadd_batch` returns."""
        return self._send("xadd_batch", [stream], _xadd_args(maxlen, entries))

    def unbegin_turn(self, record: str, started: str, queued: str, turn: int, now: float) -> bool:
        return bool(self._call("unbegin_turn", [record, started, queued], [str(turn), now]))

    def end_run(
        self,
        keys: tuple[str, str, str],
        now: float,
        turn: int,
        *,
        maxlen: int,
        mark_ttl_s: int,
        header: str,
        terminal: tuple[str, str],
        fields: dict[str, str],
    ) -> str | None:
        """See ``end_run.lua``: ``keys`` the run's record and stream and the started mark of
        ``turn``, its current turn as read. The status the run left ('' when it had ended or
        is gone), or None when its current turn is not ``turn`` (read it again)."""
        args: list[Value] = [now, str(turn), maxlen, mark_ttl_s, f"{now:.6f}", header, *terminal]
        for name, value in fields.items():
            args += [name, value]
        reply = _text(self._call("end_run", list(keys), args)) or ""
        return None if reply == "!turn" else reply

    def end_turn(
        self,
        keys: tuple[str, str, str, str],
        turn: int,
        caller: str,
        move: str,
        *,
        now: float,
        maxlen: int,
        mark_ttl_s: int,
        header: str,
        terminal: tuple[str, str],
        tokens: tuple[int, int, int],
        cost: float | None,
        fields: dict[str, str],
    ) -> tuple[bool, str]:
        """See ``end_turn.lua``: (True, the terminal's id) or (False, why not)."""
        args: list[Value] = [str(turn), caller, move, now, maxlen, mark_ttl_s, f"{now:.6f}"]
        args += [header, *terminal, *tokens, "" if cost is None else repr(float(cost))]
        for name, value in fields.items():
            args += [name, value]
        reply = self._call("end_turn", list(keys), args)
        assert isinstance(reply, list)
        done, detail = reply
        return bool(done), str(detail)

    def answer_permission(
        self, requests: str, answers: str, request_id: str, answer: str, now: float, closing: bool
    ) -> tuple[str, str]:
        reply = self._call(
            "answer_permission",
            [requests, answers],
            [request_id, answer, now, "1" if closing else "0"],
        )
        assert isinstance(reply, list)
        status, detail = reply
        return str(status), str(detail)

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


def _xadd_args(maxlen: int, entries: Sequence[tuple[str, str, str, str]]) -> list[Value]:
    args: list[Value] = [maxlen]
    for entry in entries:
        args.extend(entry)
    return args


def _xadd_reply(reply: object) -> tuple[int, int]:
    assert isinstance(reply, list)
    handled, dropped = reply
    return int(handled), int(dropped)


class SentCall:
    """A script call sent on a pooled connection of its own, its reply not yet read: the
    caller does its own work while Redis runs the script. The connection stays out of the
    pool until :meth:`reply` reads the answer (exactly once)."""

    def __init__(
        self,
        pool: ConnectionPool,
        connection: PooledConnection | None,
        again: Callable[[], object],
        reply: object = None,
    ) -> None:
        self._pool, self._connection, self._again, self._reply = pool, connection, again, reply

    def reply(self) -> tuple[int, int]:
        """The call's reply (as :meth:`Scripts.xadd_batch`). Should the connection fail, or
        Redis have forgotten the script, the call is made again the usual way: a script that
        may have run already is one whose repeat is harmless (``xadd_batch.lua``)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return _xadd_reply(self._reply)
        again = False
        try:
            reply = connection.read_response()
        except NoScriptError:
            again = True
        except REDIS_ERRORS:
            connection.disconnect()
            again = True
        except BaseException:
            connection.disconnect()  # its reply may still be unread: never hand it out again
            raise
        finally:
            self._pool.release(connection)
        if again:
            reply = self._again()
        return _xadd_reply(reply)


def _now_and_pairs(now: float, fields: dict[str, str]) -> list[Value]:
    """A script's ARGV of ``now`` then the record's field, value pairs."""
    args: list[Value] = [now]
    for name, value in fields.items():
        args += [name, value]
    return args
