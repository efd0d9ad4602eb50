"""The publisher against a real Redis: a script call left running (its reply unread) has
stored its events already, and a script Redis forgot is loaded and its call made again
(a dropped connection: tests/unit/test_publisher.py); big events go as plain XADDs in a
guarded transaction, which stores nothing a script would have refused."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from adapters.events import AssistantText, TurnComplete
from tests.helpers import wait_for
from worker.store import xadd_tx
from worker.store.keys import Keys, SyncRedis
from worker.store.publisher import SCRIPT_BATCH, SCRIPT_MIN, RedisStreamPublisher


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncRedis]:
    real = redis.Redis.from_url(redis_url, decode_responses=True)
    yield cast(SyncRedis, real)
    real.close()


@pytest.fixture
def keys(client: SyncRedis) -> Iterator[Keys]:
    keys = Keys("t" + uuid.uuid4().hex[:10])
    yield keys
    client.delete(keys.events("r1"))


def _texts(count: int, start: int = 0) -> list[AssistantText]:
    return [AssistantText(text=str(i)) for i in range(start, start + count)]


def _stored(client: SyncRedis, keys: Keys) -> list[str]:
    return [json.loads(f["data"])["text"] for _, f in client.xrange(keys.events("r1"))]


def test_events_are_in_the_stream_before_their_reply_is_read(client: SyncRedis, keys: Keys) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    assert publisher.publish(_texts(SCRIPT_BATCH)) is True
    wait_for(lambda: len(_stored(client, keys)) == SCRIPT_BATCH, timeout=5)
    assert publisher.published == 0  # nobody has read the reply yet
    assert publisher.publish(_texts(SCRIPT_MIN, SCRIPT_BATCH)) is True
    assert publisher.flush() is True
    assert publisher.published == SCRIPT_BATCH + SCRIPT_MIN
    assert _stored(client, keys) == [str(i) for i in range(SCRIPT_BATCH + SCRIPT_MIN)]


def test_a_script_redis_forgot_is_loaded_again(client: SyncRedis, keys: Keys) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    publisher.publish(_texts(SCRIPT_MIN))
    assert publisher.flush() is True
    cast(redis.Redis, client).script_flush()  # as a restarted Redis has
    publisher.publish(_texts(SCRIPT_MIN, SCRIPT_MIN))  # EVALSHA answered NOSCRIPT
    assert publisher.flush() is True
    assert _stored(client, keys) == [str(i) for i in range(2 * SCRIPT_MIN)]


# Big events (coalesced text) go as plain XADDs in a guarded transaction (worker/store/xadd_tx.py).

BIG = xadd_tx.MIN_ENTRY_BYTES


def _big(count: int, start: int = 0) -> list[AssistantText]:
    return [AssistantText(text=f"{i}:" + "x" * BIG) for i in range(start, start + count)]


def _heads(client: SyncRedis, keys: Keys) -> list[str]:
    return [text.split(":")[0] for text in _stored(client, keys)]


def test_big_events_take_the_transaction_and_small_ones_the_script(
    client: SyncRedis, keys: Keys
) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    big = [("1-0", "assistant-text", "x" * BIG, "0")] * 2
    small = [("1-0", "assistant-text", "x", "0")] * 2
    sent_big, sent_small = publisher._sent_chunk(big), publisher._sent_chunk(small)
    assert isinstance(sent_big, xadd_tx.SentTransaction)
    assert not isinstance(sent_small, xadd_tx.SentTransaction)
    sent_big.reply()
    sent_small.reply()


def test_big_events_are_stored_in_order_and_leave_no_fence(client: SyncRedis, keys: Keys) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    assert publisher.publish(_big(20)) is True
    wait_for(lambda: len(_stored(client, keys)) == 20, timeout=5)  # before its reply is read
    assert publisher.publish(_big(3, 20)) is True
    assert publisher.flush() is True
    assert publisher.published == 23 and publisher.dropped == 0
    assert _heads(client, keys) == [str(i) for i in range(23)]
    assert [entry_id for entry_id, _ in client.xrange(keys.events("r1"))][-1] == "1-22"
    assert client.exists(xadd_tx.fence_key(keys.events("r1"))) == 0


def test_a_turn_another_writer_ended_takes_no_big_event(client: SyncRedis, keys: Keys) -> None:
    other = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    other.publish([TurnComplete(text="done")])  # at 1-0, the id our batch starts at
    assert other.flush() is True
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    publisher.publish(_big(4))
    assert publisher.flush() is True
    assert (publisher.published, publisher.dropped) == (0, 4)
    assert [f["type"] for _, f in client.xrange(keys.events("r1"))] == ["turn-complete"]
    assert client.exists(xadd_tx.fence_key(keys.events("r1"))) == 0


def test_big_events_stored_by_a_try_whose_reply_was_lost_are_stored_once(
    client: SyncRedis, keys: Keys
) -> None:
    events = _big(4)
    first = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    first.publish(events[:2])
    assert first.flush() is True
    retry = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000)
    retry.publish(events)  # the guard finds 1-0 taken: the script sorts it out
    assert retry.flush() is True
    assert (retry.published, retry.dropped) == (4, 0)
    assert _heads(client, keys) == ["0", "1", "2", "3"]


def test_big_events_for_a_stream_that_is_gone_do_not_make_it_again(
    client: SyncRedis, keys: Keys
) -> None:
    publisher = RedisStreamPublisher(client, keys, "r1", 1, maxlen=10_000, start_seq=5)
    publisher.publish(_big(3))
    assert publisher.flush() is True
    assert (publisher.published, publisher.dropped) == (0, 3)
    assert client.exists(keys.events("r1")) == 0


@contextlib.contextmanager
def _own_connection(redis_url: str) -> Iterator[Any]:
    """A connection of a client of its own, to send a transaction's commands one by one."""
    ours = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        connection = ours.connection_pool.get_connection()
        yield connection
        ours.connection_pool.release(connection)
    finally:
        ours.close()


def _batch_after(
    client: SyncRedis, keys: Keys, kind: str, *, first: int
) -> tuple[str, list[tuple[Any, ...]]]:
    """A stream holding one entry, ``1-0`` of ``kind``, and the transaction of two big
    entries from ``1-{first}`` on: (the stream's key, its commands)."""
    stream = keys.events("r1")
    client.xadd(stream, {"type": kind, "data": "{}", "ts": "0"}, id="1-0")
    entries = [(f"1-{i}", "assistant-text", "x" * BIG, "0") for i in (first, first + 1)]
    return stream, xadd_tx.commands(stream, 10_000, entries)


def test_a_write_between_watch_and_exec_aborts_the_transaction(
    client: SyncRedis, keys: Keys, redis_url: str
) -> None:
    """Another writer ends the turn while the batch is on its way: EXEC runs none of it."""
    stream, commands = _batch_after(client, keys, "turn-started", first=1)
    with _own_connection(redis_url) as connection:
        connection.send_packed_command(connection.pack_commands(commands[:-1]))
        assert [connection.read_response() for _ in commands[:-1]] == [
            "OK", 1, "OK", "QUEUED", "QUEUED",
        ]  # fmt: skip
        client.xadd(stream, {"type": "turn-complete", "data": "{}", "ts": "0"}, id="1-1")
        connection.send_command("EXEC")
        replies = ["OK", 1, "OK", "QUEUED", "QUEUED", connection.read_response()]
    assert replies[-1] is None
    assert xadd_tx.outcome(replies, 2) is None  # the script then sorts it out
    assert [f["type"] for _, f in client.xrange(stream)] == ["turn-started", "turn-complete"]


def test_the_guard_aborts_a_batch_whose_first_id_is_taken(
    client: SyncRedis, keys: Keys, redis_url: str
) -> None:
    stream, commands = _batch_after(client, keys, "turn-complete", first=0)
    with _own_connection(redis_url) as connection:
        connection.send_packed_command(connection.pack_commands(commands))
        replies = [connection.read_response() for _ in commands]
    assert replies == ["OK", 0, "OK", "QUEUED", "QUEUED", None]  # EXEC ran nothing
    assert [entry_id for entry_id, _ in client.xrange(stream)] == ["1-0"]
    assert client.exists(xadd_tx.fence_key(stream)) == 0
