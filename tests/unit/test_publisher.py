"""RedisStreamPublisher: ids ``{turn}-{seq}``, order, batching, retries, masking (fakeredis)."""

from __future__ import annotations

import json
from typing import Any

import fakeredis
import pytest
import redis
from redis.commands.core import Script

from adapters.events import AssistantText, Event, TurnComplete, TurnStarted, Usage, parse_event
from worker.observe.masking import MASK, Masker
from worker.store.keys import Keys
from worker.store.lua import SOURCES
from worker.store.publisher import (
    LEAVE_RUNNING_BYTES,
    LEAVE_RUNNING_MIN,
    SCRIPT_BATCH,
    SCRIPT_MIN,
    RedisStreamPublisher,
    last_seq,
)

RUN = "r" + "b" * 24
KEYS = Keys("t")
STREAM = KEYS.events(RUN)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def client(server: fakeredis.FakeServer) -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=server, decode_responses=True)


class CountingClient:
    """A real (fake) Redis that counts round trips: one per pipeline executed or script
    called."""

    def __init__(self, inner: fakeredis.FakeRedis) -> None:
        self.inner = inner
        self.round_trips = 0

    def register_script(self, script: str) -> Any:
        return Script(self, script)

    def evalsha(self, *args: Any) -> Any:
        self.round_trips += 1
        return self.inner.evalsha(*args)

    @property
    def connection_pool(self) -> Any:
        return _CountingPool(self, self.inner.connection_pool)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self.inner.pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted(*a: Any, **kw: Any) -> Any:
            self.round_trips += 1
            return execute(*a, **kw)

        pipe.execute = counted
        return pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _CountingPool:
    """A pool whose connections count each command sent by hand (a script call left
    running) as a round trip."""

    def __init__(self, owner: CountingClient, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    def get_connection(self) -> Any:
        connection = self.inner.get_connection()
        send = connection.send_command

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.owner.round_trips += 1
            return send(*args, **kwargs)

        connection.send_command = counted
        return connection

    def release(self, connection: Any) -> None:
        del connection.send_command  # the pool's own again
        self.inner.release(connection)


def _publisher(client: Any, turn: int = 1, **kwargs: Any) -> RedisStreamPublisher:
    kwargs.setdefault("maxlen", 1000)
    kwargs.setdefault("retry_interval_s", 0.01)
    return RedisStreamPublisher(client, KEYS, RUN, turn, **kwargs)


def _texts(*texts: str) -> list[Event]:
    return [AssistantText(text=t) for t in texts]


def _entries(client: fakeredis.FakeRedis) -> list[tuple[str, dict[str, str]]]:
    return list(client.xrange(STREAM))


def _turn_one(client: fakeredis.FakeRedis) -> None:
    """The run's first event: a later turn writes to the stream it made."""
    client.xadd(STREAM, {"type": "turn-started", "data": "{}", "ts": "1"}, id="1-0")


def test_entry_ids_are_turn_and_seq(client: fakeredis.FakeRedis) -> None:
    _turn_one(client)
    publisher = _publisher(client, turn=3)
    events = [TurnStarted(harness="pi", input_chars=2), *_texts("a", "b")]
    assert publisher.publish(events) is True
    assert [entry_id for entry_id, _ in _entries(client)][1:] == ["3-0", "3-1", "3-2"]
    assert publisher.seq == 3
    assert publisher.published == 3


def test_entry_fields_are_type_data_ts(client: fakeredis.FakeRedis) -> None:
    event = Usage(input_tokens=3, cost_usd=0.5)
    _publisher(client).publish([event])
    ((_, fields),) = _entries(client)
    assert set(fields) == {"type", "data", "ts"}
    assert fields["type"] == "usage"
    assert parse_event(fields["type"], json.loads(fields["data"])) == event
    assert float(fields["ts"]) > 1_600_000_000


def test_events_keep_order_across_publish_calls(client: fakeredis.FakeRedis) -> None:
    _turn_one(client)
    publisher = _publisher(client, turn=2)
    publisher.publish(_texts("a", "b"))
    publisher.publish([])
    publisher.publish(_texts("c"))
    publisher.publish([TurnComplete(text="d")])
    entries = _entries(client)[1:]
    assert [e[0] for e in entries] == ["2-0", "2-1", "2-2", "2-3"]
    assert [json.loads(e[1]["data"])["text"] for e in entries] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    "size", [1, SCRIPT_MIN, LEAVE_RUNNING_MIN], ids=["xadd", "script", "left-running"]
)
def test_a_stream_that_is_gone_is_not_made_again(client: fakeredis.FakeRedis, size: int) -> None:
    """Only the run's first event makes its stream: one gone later (Redis lost it) would be
    made again with no end and no expiry, so what comes for it is dropped."""
    publisher = _publisher(client, turn=1, start_seq=5)
    assert publisher.publish(_texts(*"x" * size)) is True
    assert publisher.flush() is True
    assert client.exists(STREAM) == 0
    assert publisher.dropped == size and publisher.superseded
    _publisher(client, turn=2).publish(_texts("a"))
    assert client.exists(STREAM) == 0
    _publisher(client, turn=1).publish(_texts("first"))
    assert [e[0] for e in _entries(client)] == ["1-0"]


def test_turns_are_ranges_of_the_stream(client: fakeredis.FakeRedis) -> None:
    _publisher(client, turn=1).publish(_texts("a", "b"))
    _publisher(client, turn=2).publish(_texts("c"))
    assert [e[0] for e in client.xrange(STREAM, "2", "2")] == ["2-0"]
    assert [e[0] for e in client.xrange(STREAM, "1", "1")] == ["1-0", "1-1"]


def test_start_seq_continues_a_turn(client: fakeredis.FakeRedis) -> None:
    _publisher(client, turn=1).publish(_texts("a", "b"))
    _publisher(client, turn=1, start_seq=2).publish(_texts("c"))
    assert [e[0] for e in _entries(client)] == ["1-0", "1-1", "1-2"]


def test_one_round_trip_per_publish_call(client: fakeredis.FakeRedis) -> None:
    client.script_load(SOURCES["xadd_batch"])  # as after a first call (the script is loaded once)
    counting = CountingClient(client)
    publisher = _publisher(counting)
    publisher.publish(_texts(*"abcdefghij"))
    assert counting.round_trips == 1
    publisher.publish(_texts("k", "l"))
    assert counting.round_trips == 2
    assert len(_entries(client)) == 12


def test_big_batch_split_into_bounded_script_calls(client: fakeredis.FakeRedis) -> None:
    client.script_load(SOURCES["xadd_batch"])
    counting = CountingClient(client)
    publisher = _publisher(counting, maxlen=10_000)
    texts = [str(i) for i in range(SCRIPT_BATCH * 2 + 1)]
    assert publisher.publish(_texts(*texts)) is True
    assert counting.round_trips == 3
    assert publisher.flush() is True
    assert publisher.published == len(texts)
    entries = _entries(client)
    assert [json.loads(e[1]["data"])["text"] for e in entries] == texts
    assert [e[0] for e in entries] == [f"1-{i}" for i in range(len(texts))]


@pytest.mark.parametrize(
    "size", [1, SCRIPT_MIN, LEAVE_RUNNING_MIN], ids=["xadd", "script", "left-running"]
)
def test_error_other_than_stored_id_is_raised(client: fakeredis.FakeRedis, size: int) -> None:
    client.set(STREAM, "not a stream")
    publisher = _publisher(client)
    with pytest.raises(redis.ResponseError):  # a script call's, at the latest when flushed
        publisher.publish(_texts(*(str(i) for i in range(size))))
        publisher.flush()


@pytest.mark.parametrize(
    "size", [2, SCRIPT_MIN * 2, LEAVE_RUNNING_MIN * 2], ids=["xadd", "script", "left-running"]
)
def test_retry_of_a_partly_stored_batch_stores_the_rest_once(
    client: fakeredis.FakeRedis, size: int
) -> None:
    texts = [str(i) for i in range(size)]
    _publisher(client).publish(_texts(*texts[: size // 2]))
    retry = _publisher(client)
    assert retry.publish(_texts(*texts)) is True
    assert retry.flush() is True
    assert retry.published == size
    entries = _entries(client)
    assert [json.loads(e[1]["data"])["text"] for e in entries] == texts


def test_a_big_batchs_reply_is_read_at_the_next_publish(client: fakeredis.FakeRedis) -> None:
    publisher = _publisher(client)
    texts = [str(i) for i in range(LEAVE_RUNNING_MIN)]
    assert publisher.publish(_texts(*texts)) is True
    assert (publisher.pending, publisher.published) == (LEAVE_RUNNING_MIN, 0)  # its reply unread
    assert publisher.publish(_texts("next")) is True  # read first, then the next sent
    assert (publisher.pending, publisher.published) == (0, LEAVE_RUNNING_MIN + 1)
    assert [e[0] for e in _entries(client)] == [f"1-{i}" for i in range(LEAVE_RUNNING_MIN + 1)]


def test_a_few_big_events_are_left_running_too(client: fakeredis.FakeRedis) -> None:
    """Coalesced text (HARNESS_COALESCE_TEXT_CHARS): a batch of a few big events keeps Redis
    as busy as many small ones, and overlaps the worker's next read alike."""
    publisher = _publisher(client)
    texts = ["x" * (LEAVE_RUNNING_BYTES // 2), "y" * (LEAVE_RUNNING_BYTES // 2)]
    assert publisher.publish(_texts(*texts)) is True
    assert (publisher.pending, publisher.published) == (2, 0)  # its reply unread
    small = RedisStreamPublisher(client, KEYS, "r" + "c" * 24, 1, maxlen=1000)
    assert small.publish(_texts("a", "b")) is True
    assert (small.pending, small.published) == (0, 2)  # a small batch's reply read at once
    assert publisher.flush() is True
    assert [json.loads(e[1]["data"])["text"] for e in _entries(client)] == texts


def test_a_call_whose_connection_dropped_is_made_again_and_stores_once(
    client: fakeredis.FakeRedis,
) -> None:
    publisher = _publisher(client)
    texts = [str(i) for i in range(LEAVE_RUNNING_MIN)]
    publisher.publish(_texts(*texts))
    (connection,) = client.connection_pool._in_use_connections  # the call's, reply unread
    connection.disconnect()  # the reply is lost with it
    assert publisher.flush() is True
    assert publisher.published == LEAVE_RUNNING_MIN
    assert [json.loads(e[1]["data"])["text"] for e in _entries(client)] == texts
    assert not client.connection_pool._in_use_connections  # back in the pool


def test_a_script_redis_forgot_is_loaded_and_its_call_made_again(
    client: fakeredis.FakeRedis,
) -> None:
    publisher = _publisher(client)
    publisher.publish(_texts(*(str(i) for i in range(LEAVE_RUNNING_MIN))))
    assert publisher.flush() is True
    client.script_flush()  # as after a Redis restart
    texts = [str(i) for i in range(LEAVE_RUNNING_MIN)]
    assert publisher.publish(_texts(*texts)) is True
    assert publisher.flush() is True
    assert publisher.published == 2 * LEAVE_RUNNING_MIN
    assert len(_entries(client)) == 2 * LEAVE_RUNNING_MIN


@pytest.mark.parametrize("left_running", [False, True])
def test_a_stream_that_went_on_without_us_drops_the_rest(
    client: fakeredis.FakeRedis, left_running: bool
) -> None:
    publisher = _publisher(client)
    other = _publisher(client)  # another writer ended the turn first, with these ids
    other.publish([TurnComplete(text="done")])
    assert other.flush() is True
    size = LEAVE_RUNNING_MIN
    publisher.publish(_texts(*(str(i) for i in range(size))))
    if not left_running:
        assert publisher.flush() is True
    publisher.publish(_texts("after"))
    assert publisher.flush() is True
    assert publisher.published == 0
    assert publisher.dropped == size + 1
    assert [e[1]["type"] for e in _entries(client)] == ["turn-complete"]


def test_retried_batch_harmless_when_ids_already_stored(client: fakeredis.FakeRedis) -> None:
    events = _texts("a", "b", "c", "d")
    _publisher(client).publish(events[:2])  # delivered, but the sender never saw the reply
    retry = _publisher(client)
    assert retry.publish(events) is True
    assert retry.pending == 0
    assert retry.published == 4
    entries = _entries(client)
    assert [e[0] for e in entries] == ["1-0", "1-1", "1-2", "1-3"]
    assert [json.loads(e[1]["data"])["text"] for e in entries] == ["a", "b", "c", "d"]


def test_same_ids_published_twice_store_no_duplicate(client: fakeredis.FakeRedis) -> None:
    events = _texts("a", "b")
    assert _publisher(client).publish(events) is True
    assert _publisher(client).publish(events) is True
    assert len(_entries(client)) == 2


def test_events_wait_in_memory_while_redis_down(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer
) -> None:
    publisher = _publisher(client)
    server.connected = False
    assert publisher.publish(_texts("a", "b")) is False
    assert publisher.pending == 2
    assert publisher.publish(_texts("c")) is False
    assert publisher.pending == 3
    assert publisher.drain(0.05) is False
    server.connected = True
    assert publisher.flush(force=True) is True
    assert publisher.pending == 0
    entries = _entries(client)
    assert [e[0] for e in entries] == ["1-0", "1-1", "1-2"]
    assert [json.loads(e[1]["data"])["text"] for e in entries] == ["a", "b", "c"]


def test_drain_sends_everything_once_redis_back(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer
) -> None:
    publisher = _publisher(client)
    server.connected = False
    publisher.publish(_texts("a"))
    server.connected = True
    assert publisher.drain(5) is True
    assert len(_entries(client)) == 1


def test_flush_waits_retry_interval_unless_forced(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer
) -> None:
    publisher = _publisher(client, retry_interval_s=60)
    server.connected = False
    publisher.publish(_texts("a"))
    server.connected = True
    assert publisher.flush() is False  # still inside the retry interval
    assert publisher.flush(force=True) is True


SECRET = "sk-live-0123456789"
ODD_SECRET = 'pa"ss\\wörd-42'


def test_secret_values_masked_in_published_data(client: fakeredis.FakeRedis) -> None:
    publisher = _publisher(client, masker=Masker({"API_KEY": SECRET}))
    publisher.publish(_texts(f"the key is {SECRET}!", "nothing here"))
    entries = _entries(client)
    assert SECRET not in json.dumps(entries)
    assert json.loads(entries[0][1]["data"])["text"] == f"the key is {MASK}!"
    assert json.loads(entries[1][1]["data"])["text"] == "nothing here"


def test_json_escaped_secret_masked_and_data_stays_json(client: fakeredis.FakeRedis) -> None:
    publisher = _publisher(client, masker=Masker({"PASSWORD": ODD_SECRET}))
    publisher.publish(_texts(f"pw={ODD_SECRET}"))
    ((_, fields),) = _entries(client)
    data = json.loads(fields["data"])  # masking kept the data valid JSON
    assert data["text"] == f"pw={MASK}"
    assert ODD_SECRET not in fields["data"]
    assert json.dumps(ODD_SECRET, ensure_ascii=False)[1:-1] not in fields["data"]


@pytest.mark.parametrize(
    "form",
    [
        ODD_SECRET,
        json.dumps(ODD_SECRET, ensure_ascii=False)[1:-1],
        json.dumps(ODD_SECRET)[1:-1],
    ],
    ids=["raw", "json-escaped", "json-ascii-escaped"],
)
def test_masker_masks_every_form_of_secret(form: str) -> None:
    masker = Masker([ODD_SECRET])
    assert masker.mask(f"<{form}>") == f"<{MASK}>"


def test_masker_leaves_short_values_alone() -> None:
    masker = Masker({"A": "ab", "B": ""})
    assert not masker
    assert masker.mask("ab cd") == "ab cd"


def test_masker_masks_longer_secret_first() -> None:
    masker = Masker(["abcd", "abcdefgh"])
    assert masker.mask("xabcdefghx") == f"x{MASK}x"


def test_last_seq_empty_turn(client: fakeredis.FakeRedis) -> None:
    assert last_seq(client, KEYS, RUN, 1) == (0, None)


def test_last_seq_next_free_seq_and_last_type(client: fakeredis.FakeRedis) -> None:
    _publisher(client, turn=1).publish([*_texts("a"), TurnComplete(text="x")])
    _publisher(client, turn=2).publish([TurnStarted(harness="pi", input_chars=1), *_texts("b")])
    _publisher(client, turn=10).publish(_texts("c"))
    assert last_seq(client, KEYS, RUN, 1) == (2, "turn-complete")
    assert last_seq(client, KEYS, RUN, 2) == (2, "assistant-text")
    assert last_seq(client, KEYS, RUN, 3) == (0, None)
    assert last_seq(client, KEYS, RUN, 10) == (1, "assistant-text")


def test_masker_masks_a_match_once() -> None:
    """A secret found inside ``[masked]`` (here "mask") does not mask the mask again."""
    masker = Masker(["mask", "s3cr3t-value"])
    assert masker.mask("a s3cr3t-value and a mask") == f"a {MASK} and a {MASK}"
