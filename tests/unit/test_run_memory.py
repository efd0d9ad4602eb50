"""What an idle run costs Redis (row 10 of docs/performance.md), on a Redis server of the
test's own with Redis's defaults: the record a listpack, the stream at its size once its turn
ended, and every entry, id and TTL as they were."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, cast

import fakeredis
import pytest
import redis

from bench.private_redis import PrivateRedis
from worker.options.spec import RunOptions
from worker.store.keys import Keys
from worker.store.records import LONG_FIELDS, RunStore

RUN = "r" + "b" * 24
KEYS = Keys("mem")
LONG_OPTIONS = RunOptions(
    harness="stdio-json",
    executable="/opt/harnesses/bin/a-harness-with-a-long-path --and --some --arguments",
    system_prompt="You are a careful engineer. " * 20,
    allow=("Bash(git *)", "Read(*)", "Edit(src/**)"),
)
BUDGET = {"max_cost_usd": None, "max_tokens": None, "max_turns": None, "max_wall_s": None}


@pytest.fixture
def client(private_redis: PrivateRedis) -> redis.Redis:
    return redis.Redis(port=private_redis.port, decode_responses=True)


@pytest.fixture
def store(client: redis.Redis) -> RunStore:
    store = RunStore(cast(Any, client), KEYS, retention_s=600)
    store.create(RUN, LONG_OPTIONS, queue="mem.host.local.h", sandbox="local", budget=BUDGET)
    return store


def _end(store: RunStore, turn: int = 1) -> tuple[bool, str]:
    return store.end_turn(
        RUN,
        turn,
        caller="outsider",
        status="idle",
        header='{"harness":"stdio-json","attempt":1,"input_chars":0}',
        terminal=("turn-complete", '{"text":"ok"}'),
        usage=(0, 0, 0, None),
        changes={"session_id": "s-1", "carry": {"thread": "t-1"}},
        maxlen=1000,
        mark_ttl_s=600,
    )


def _xadd(client: redis.Redis, entries: int, turn: int = 1) -> None:
    for seq in range(entries):
        fields = {"type": "assistant-text", "data": '{"text":"hello"}', "ts": "1.5"}
        client.xadd(KEYS.events(RUN), fields, id=f"{turn}-{seq}")  # type: ignore[arg-type]


def test_the_record_stays_a_listpack_with_long_options_warnings_and_budget(
    store: RunStore, client: redis.Redis
) -> None:
    store.update(RUN, warnings=["this harness enforces no permission policy: " * 3])
    assert len(LONG_OPTIONS.model_dump_json()) > 64
    assert client.object("encoding", KEYS.run(RUN)) == "listpack"
    assert not LONG_FIELDS.intersection(client.hkeys(KEYS.run(RUN)))
    record = store.record(RUN)
    assert record.options == LONG_OPTIONS
    assert record.budget == BUDGET
    assert record.warnings == ["this harness enforces no permission policy: " * 3]
    assert client.type(KEYS.run_long(RUN)) == "string"
    store.update(RUN, warnings=None)
    assert store.record(RUN).warnings is None
    assert sorted(json.loads(client.get(KEYS.run_long(RUN)) or "")) == ["budget", "options"]


def test_long_fields_changed_at_once_are_all_kept(store: RunStore, client: redis.Redis) -> None:
    client.expire(KEYS.run_long(RUN), 500)
    changes = [
        {"warnings": [f"w{i}"]} if i % 2 else {"budget": {"max_turns": i}} for i in range(20)
    ]
    threads = [threading.Thread(target=store.update, args=(RUN,), kwargs=c) for c in changes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    record = store.record(RUN)
    assert record.warnings and record.warnings[0] in {f"w{i}" for i in range(1, 20, 2)}
    assert record.budget["max_turns"] in range(0, 20, 2)
    assert record.options == LONG_OPTIONS
    assert 490 <= int(client.ttl(KEYS.run_long(RUN))) <= 500


def test_an_ended_turns_stream_of_one_node_is_held_at_its_size(
    store: RunStore, client: redis.Redis
) -> None:
    _xadd(client, 3)
    client.expire(KEYS.events(RUN), 500)
    before = client.xrange(KEYS.events(RUN))
    assert int(client.memory_usage(KEYS.events(RUN), samples=0) or 0) > 4096  # the 4 KiB node
    assert _end(store) == (True, "1-3")
    after = client.xrange(KEYS.events(RUN))
    assert after[:3] == before
    assert after[3] == (
        "1-3",
        {"type": "turn-complete", "data": '{"text":"ok"}', "ts": after[3][1]["ts"]},
    )
    assert int(client.memory_usage(KEYS.events(RUN), samples=0) or 0) < 1500
    assert 490 <= int(client.ttl(KEYS.events(RUN))) <= 500
    info = client.xinfo_stream(KEYS.events(RUN))
    assert (info["last-generated-id"], info["entries-added"]) == ("1-3", 4)
    assert store.record(RUN).status == "idle"
    # The next turn appends to it as before; an id at or below the last is still refused.
    client.xadd(KEYS.events(RUN), {"type": "turn-started", "data": "{}", "ts": "2"}, id="2-0")
    with pytest.raises(redis.ResponseError):
        client.xadd(KEYS.events(RUN), {"type": "x", "data": "{}", "ts": "2"}, id="1-3")


def test_a_reader_blocked_on_the_stream_gets_the_terminal_and_then_waits_on(
    store: RunStore, client: redis.Redis, private_redis: PrivateRedis
) -> None:
    _xadd(client, 2)
    got: list[Any] = []

    def read(cursor: str) -> None:
        reader = redis.Redis(port=private_redis.port, decode_responses=True)
        got.append(reader.xread({KEYS.events(RUN): cursor}, block=5000))
        got.append(reader.xread({KEYS.events(RUN): "1-2"}, block=300))
        reader.close()

    thread = threading.Thread(target=read, args=("1-1",))
    thread.start()
    deadline = time.monotonic() + 10
    while client.info("clients")["blocked_clients"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _end(store) == (True, "1-2")
    thread.join(10)
    assert [entry_id for entry_id, _ in got[0][0][1]] == ["1-2"]
    assert not got[1]  # the stream written back is not news


def test_a_redis_user_refused_restore_still_ends_the_turn(
    store: RunStore, client: redis.Redis, private_redis: PrivateRedis
) -> None:
    client.acl_setuser(
        "worker", enabled=True, nopass=True, categories=["+@all", "-@dangerous"], keys=["*"]
    )
    worker = redis.Redis(port=private_redis.port, username="worker", decode_responses=True)
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.restore("x", 0, b"", replace=True)
    _xadd(client, 3)
    limited = RunStore(cast(Any, worker), KEYS, retention_s=600)
    assert _end(limited) == (True, "1-3")
    assert int(client.memory_usage(KEYS.events(RUN), samples=0) or 0) > 4096  # kept as it was
    assert len(client.xrange(KEYS.events(RUN))) == 4
    record = store.record(RUN)
    assert (record.status, record.session_id) == ("idle", "s-1")


def test_a_stream_of_several_nodes_keeps_its_entries(store: RunStore, client: redis.Redis) -> None:
    _xadd(client, 250)  # more than one node (stream-node-max-entries: 100)
    assert client.xinfo_stream(KEYS.events(RUN))["radix-tree-keys"] > 1
    assert _end(store) == (True, "1-250")
    entries = client.xrange(KEYS.events(RUN))
    assert [entry_id for entry_id, _ in entries] == [f"1-{seq}" for seq in range(251)]


def test_a_script_never_writes_a_long_field() -> None:
    fake = RunStore(cast(Any, fakeredis.FakeRedis(decode_responses=True)), KEYS, retention_s=60)
    fake.create(RUN, LONG_OPTIONS, queue="q", sandbox="local")
    with pytest.raises(ValueError, match="warnings"):
        fake.end_run(RUN, warnings=["late"])


def test_a_record_written_with_its_long_fields_inside_is_read_and_moved_out(
    store: RunStore, client: redis.Redis
) -> None:
    old = {"options": LONG_OPTIONS.model_dump_json(), "warnings": '["old"]'}
    client.delete(KEYS.run_long(RUN))
    client.hset(KEYS.run(RUN), mapping=old)
    assert store.record(RUN).warnings == ["old"]
    assert store.record(RUN).options == LONG_OPTIONS
    store.update(RUN, warnings=["new"])
    assert store.record(RUN).warnings == ["new"]
    assert "warnings" not in client.hkeys(KEYS.run(RUN))
