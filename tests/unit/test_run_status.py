"""A run's status moves by one table (worker/store/status.py), applied by the Lua scripts;
a turn ends by one script (end_turn.lua) that checks who ends it and that it has no
terminal yet (fakeredis with Lua)."""

from __future__ import annotations

import ast
from pathlib import Path

import fakeredis
import pytest

from worker.options.spec import RunOptions
from worker.store.keys import Keys
from worker.store.lua import SOURCES, scripts
from worker.store.records import RunStore
from worker.store.status import FINISH_MOVES, IN_FLIGHT, TRANSITIONS, RunStatus

ROOT = Path(__file__).resolve().parents[2]
RUN = "r" + "c" * 24
KEYS = Keys("t")
ALL: tuple[RunStatus, ...] = ("starting", "running", "idle", "parked", "ended", "failed")


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def store(client: fakeredis.FakeRedis) -> RunStore:
    store = RunStore(client, KEYS, retention_s=60)
    store.create(RUN, RunOptions(harness="stdio-json", executable="harness-demo"), "q", "local")
    return store


def _end(
    store: RunStore, caller: str, turn: int = 1, status: RunStatus = "idle"
) -> tuple[bool, str]:
    return store.end_turn(
        RUN,
        turn,
        caller=caller,
        status=status,
        header='{"harness": "stdio-json"}',
        terminal=("session-error", '{"reason": "cancelled"}'),
        usage=(1, 1, 0, None),
        changes={"last_error": "cancelled: x"},
        maxlen=1000,
        mark_ttl_s=60,
    )


def _claim(client: fakeredis.FakeRedis, turn: int = 1, token: str = "w/d") -> bool:
    keys = (
        KEYS.turn_started(RUN, turn),
        KEYS.turn_owner(RUN, turn),
        KEYS.events(RUN),
        KEYS.run(RUN),
        KEYS.turn_queued(RUN, turn),
        KEYS.cancel(RUN, turn),
    )
    return scripts(client).claim_turn(keys, turn, token, 60, 30) is not None


@pytest.mark.parametrize("move", sorted(TRANSITIONS))
@pytest.mark.parametrize("status", ALL)
def test_every_move_from_every_status_is_the_table(
    client: fakeredis.FakeRedis, move: str, status: RunStatus
) -> None:
    probe = "local to = move(KEYS[1], ARGV[1], ARGV[2]) return to or ''"
    prelude = SOURCES["mark_running"].split("if move(")[0]
    key = KEYS.run(RUN)
    client.hset(key, mapping={"status": status})
    moved = client.eval(prelude + probe, 1, key, move, "1.0")
    sources, target = TRANSITIONS[move]  # type: ignore[index]
    if status in sources:
        assert (moved, client.hget(key, "status")) == (target, target)
    else:
        assert (moved, client.hget(key, "status")) == ("", status)


def test_no_python_code_writes_the_status_field() -> None:
    offenders = []
    for path in sorted((ROOT / "worker").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(k.arg == "status" for k in node.keywords):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in {"update", "hset", "RecordChanges"}:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_update_refuses_status(store: RunStore) -> None:
    with pytest.raises(ValueError, match="transitions"):
        store.update(RUN, status="idle")  # type: ignore[call-arg]


def test_every_finish_status_has_a_move() -> None:
    assert set(FINISH_MOVES.values()) <= set(TRANSITIONS)
    assert set(IN_FLIGHT) == {"starting", "running", "parked"}


def test_an_unclaimed_end_bars_any_later_claim(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    assert _end(store, "unclaimed") == (True, "1-1")
    claimed = _claim(client)
    assert not claimed
    entries = client.xrange(KEYS.events(RUN))
    assert [fields["type"] for _, fields in entries] == ["turn-started", "session-error"]
    record = store.record(RUN)
    assert (record.status, record.last_error, record.input_tokens) == ("idle", "cancelled: x", 1)


def test_a_claimed_turn_refuses_an_unclaimed_end_and_its_owner_ends_it(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    assert _claim(client)
    assert _end(store, "unclaimed") == (False, "claimed")
    assert _end(store, "outsider") == (False, "owned")
    assert _end(store, "lost") == (False, "owned")
    assert _end(store, "owner:w/other") == (False, "not-owner")
    assert _end(store, "owner:w/d") == (True, "1-1")
    assert _end(store, "owner:w/d") == (False, "ended")
    assert store.record(RUN).status == "idle"


def test_a_lost_turn_is_ended_by_anyone_once_its_heartbeat_is_gone(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    assert _end(store, "lost") == (False, "queued")
    _claim(client)
    client.delete(KEYS.turn_owner(RUN, 1))
    assert _end(store, "lost") == (True, "1-1")
    assert _end(store, "outsider") == (False, "ended")


def test_its_owner_ends_a_turn_without_a_mark_left_and_no_copy_claims_it_again(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    assert _claim(client)
    assert _end(store, "owner:w/d") == (True, "1-1")
    assert not client.exists(KEYS.turn_started(RUN, 1))
    assert not _claim(client)  # the same delivery again, its reply lost
    assert not _claim(client, token="w/other")  # a copy of the message
    assert _end(store, "lost") == (False, "ended")


def test_a_turn_whose_terminal_was_trimmed_away_is_not_claimed_once_a_later_one_began(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    assert _claim(client)
    assert _end(store, "owner:w/d") == (True, "1-1")
    assert store.begin_turn(RUN) == 2
    client.delete(KEYS.events(RUN))  # trimmed: turn 2 published past the stream's limit
    assert not _claim(client, 1, "w/other")
    assert _claim(client, 2)


def test_the_terminal_continues_the_turns_stream(
    store: RunStore, client: fakeredis.FakeRedis
) -> None:
    client.xadd(KEYS.events(RUN), {"type": "turn-started", "data": "{}", "ts": "1"}, id="1-0")
    client.xadd(KEYS.events(RUN), {"type": "assistant-text", "data": "{}", "ts": "1"}, id="1-1")
    assert _end(store, "outsider") == (True, "1-2")


def test_an_unsent_turn_gives_its_number_back(store: RunStore) -> None:
    _end(store, "outsider")
    assert store.begin_turn(RUN) == 2
    assert store.unbegin_turn(RUN, 2)
    record = store.record(RUN)
    assert (record.status, record.turns, record.current_turn) == ("idle", 1, 1)
    assert store.begin_turn(RUN) == 2


def test_a_taken_turn_is_not_given_back(store: RunStore, client: fakeredis.FakeRedis) -> None:
    _end(store, "outsider")
    assert store.begin_turn(RUN) == 2
    client.set(KEYS.turn_started(RUN, 2), "w/d")
    assert not store.unbegin_turn(RUN, 2)
    assert store.record(RUN).turns == 2
