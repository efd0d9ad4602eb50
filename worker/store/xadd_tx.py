"""Big events appended as plain XADDs in one transaction, not through ``xadd_batch.lua``.

A script is handed its arguments as Lua strings, and Redis pays for that by the byte: a script
that does nothing took ~350 us of Redis's time for 256 KiB of arguments, while eight XADDs of
32 KiB took ~210 us (Redis 7.0 here; docs/performance.md, row 6). Coalesced text is made of
such entries. So a batch whose entries hold at least :data:`MIN_ENTRY_BYTES` each on average
is sent as one pipeline, the script's checks done first, outside the data's way::

    WATCH stream fence
    EVAL GUARD 2 stream fence FIRST-ID     an entry at or after the batch's first id (an earlier
                                           try of ours whose reply was lost, or a writer that
                                           ended the turn without us): the fence is touched
    MULTI
    XADD stream [NOMKSTREAM] MAXLEN ~ N ID type T data D ts TS    (each entry)
    EXEC

EXEC runs the XADDs only when the guard found nothing in their way and nobody wrote to the
stream since WATCH; otherwise it runs none (a touched key aborts it), and the batch goes
through ``xadd_batch.lua``, which sorts out what is stored, what was ours and what is dropped.
A stream that is gone (NOMKSTREAM) stores none of them: the whole batch is dropped, as the
script drops it. The pipeline is one round trip, its replies read later like a script call's
(:class:`SentTransaction`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from redis.exceptions import ResponseError

from worker.store.errors import REDIS_ERRORS
from worker.store.event_ids import FIRST_ID
from worker.store.keys import ConnectionPool, PooledConnection, Value

MIN_ENTRY_BYTES = 8 * 1024
"""Entries at least this big on average go this way; smaller ones through the script, where
one reply for a thousand entries costs the worker far less than a reply each."""

GUARD = """if #redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', 1) == 0 then return 1 end
redis.call('SET', KEYS[2], '1')
redis.call('DEL', KEYS[2])
return 0"""
"""1 when nothing is at or after ARGV[1]; else 0, the fence touched (set and deleted at once:
no key is left) so that the WATCHed transaction runs nothing. Sent with EVAL, never EVALSHA: a
Redis that has forgotten a script answers NOSCRIPT, and the XADDs after it would then run
unguarded."""

Entry = tuple[str, str, str, str]
"""(entry id, type, data, ts), as the publisher holds them."""


def fence_key(stream: str) -> str:
    """The key a guard touches to abort the batch's transaction (never left behind)."""
    return f"{stream}:fence"


def commands(stream: str, maxlen: int, entries: Sequence[Entry]) -> list[tuple[Value, ...]]:
    fence = fence_key(stream)
    out: list[tuple[Value, ...]] = [
        ("WATCH", stream, fence),
        ("EVAL", GUARD, 2, stream, fence, entries[0][0]),
        ("MULTI",),
    ]
    for entry_id, kind, data, ts in entries:
        # Only the run's first event may create its stream (worker/store/publisher.py).
        head: tuple[Value, ...] = (
            ("XADD", stream) if entry_id == FIRST_ID else ("XADD", stream, "NOMKSTREAM")
        )
        fields = ("type", kind, "data", data, "ts", ts)
        out.append((*head, "MAXLEN", "~", maxlen, entry_id, *fields))
    out.append(("EXEC",))
    return out


def outcome(replies: Sequence[object], size: int) -> tuple[int, int] | None:
    """(entries handled, entries dropped) from the pipeline's replies, as ``xadd_batch.lua``
    answers; None when the transaction stored nothing it could vouch for (aborted, refused,
    or anything unexpected): the batch then goes through the script."""
    replies = [_text(reply) for reply in replies]  # a client that does not decode: bytes
    if len(replies) != size + 4 or replies[1] != 1 or replies[2] != "OK":
        return None
    if any(reply != "QUEUED" for reply in replies[3:-1]):
        return None
    stored = replies[-1]
    if not isinstance(stored, list) or len(stored) != size:
        return None  # aborted (None), or refused as a whole (EXECABORT)
    if all(isinstance(entry_id, str | bytes) for entry_id in stored):
        return size, 0
    if all(entry_id is None for entry_id in stored):
        return size, size  # NOMKSTREAM: the stream is gone, and so is the batch
    return None


def _text(reply: object) -> object:
    return reply.decode() if isinstance(reply, bytes) else reply


class SentTransaction:
    """The pipeline sent on a pooled connection of its own, its replies not yet read (as
    :class:`worker.store.lua.SentCall`): Redis runs it while the worker goes on."""

    def __init__(
        self,
        pool: ConnectionPool,
        connection: PooledConnection | None,
        size: int,
        through_script: Callable[[], tuple[int, int]],
    ) -> None:
        self._pool, self._connection, self._size = pool, connection, size
        self._through_script = through_script

    def reply(self) -> tuple[int, int]:
        """(entries handled, entries dropped); read exactly once. Should the connection fail,
        or the transaction not vouch for its batch, the batch goes through the script (a
        repeat of what may have been stored is harmless there)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return self._through_script()
        replies: list[object] | None
        try:
            replies = _read(connection, self._size + 4)
        except REDIS_ERRORS:
            connection.disconnect()
            replies = None
        except BaseException:
            connection.disconnect()  # replies may still be unread: never hand it out again
            raise
        finally:
            self._pool.release(connection)
        handled = None if replies is None else outcome(replies, self._size)
        return handled if handled is not None else self._through_script()


def _read(connection: PooledConnection, count: int) -> list[object]:
    replies: list[object] = []
    for _ in range(count):
        try:
            replies.append(connection.read_response())
        except ResponseError as exc:  # read on: every reply must be taken
            replies.append(exc)
    return replies


def send(
    pool: ConnectionPool,
    stream: str,
    maxlen: int,
    entries: Sequence[Entry],
    through_script: Callable[[], tuple[int, int]],
) -> SentTransaction:
    """Send the batch's pipeline, its replies read by :meth:`SentTransaction.reply`."""
    connection = pool.get_connection()
    try:
        connection.send_packed_command(connection.pack_commands(commands(stream, maxlen, entries)))
    except REDIS_ERRORS:
        connection.disconnect()
        pool.release(connection)
        return SentTransaction(pool, None, len(entries), through_script)
    return SentTransaction(pool, connection, len(entries), through_script)
