"""RunStore: the run record hash and its atomic turn bookkeeping (fakeredis)."""

from __future__ import annotations

import json
import typing

import fakeredis
import pytest

from worker.errors import RunBusy, RunEnded, RunNotFound
from worker.options.spec import RunOptions
from worker.store.keys import Keys
from worker.store.records import CONTRACT_FIELDS, RecordChanges, RunRecord, RunStore
from worker.store.status import RunStatus

RUN = "r" + "a" * 24
KEYS = Keys("t")


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def store(client: fakeredis.FakeRedis) -> RunStore:
    return RunStore(client, KEYS, retention_s=60)


@pytest.fixture
def created(store: RunStore) -> RunStore:
    options = RunOptions(harness="stdio-json", executable="harness-demo", model="m-1")
    store.create(RUN, options, queue="t.host.h", sandbox="local")
    return store


def _finish(
    store: RunStore,
    turn: int,
    usage: tuple[int, int, int, float | None],
    *,
    status: RunStatus = "idle",
    changes: RecordChanges | None = None,
) -> bool:
    """End a turn as a caller no worker holds it for (no claim in these tests)."""
    done, _ = store.end_turn(
        RUN,
        turn,
        caller="outsider",
        status=status,
        header="{}",
        terminal=("turn-complete", "{}"),
        usage=usage,
        changes=changes or {},
        maxlen=1000,
        mark_ttl_s=60,
    )
    return done


def test_create_writes_contract_fields_with_turn_one_in_flight(
    created: RunStore, client: fakeredis.FakeRedis
) -> None:
    record = created.get(RUN)
    assert set(CONTRACT_FIELDS) <= set(record)
    assert record["run_id"] == RUN
    assert record["harness"] == "stdio-json"
    assert record["status"] == "starting"
    assert record["turns"] == 1
    assert record["current_turn"] == 1
    assert record["model_requested"] == "m-1"
    assert record["model_reported"] is None
    assert record["session_id"] is None
    assert record["cost_usd"] is None
    assert (record["input_tokens"], record["output_tokens"]) == (0, 0)
    assert record["queue"] == "t.host.h"
    assert isinstance(record["created_at"], float)
    assert client.sismember(KEYS.runs_index(), RUN)


def test_options_round_trip_through_record(created: RunStore) -> None:
    options = created.record(RUN).options
    assert options == RunOptions(harness="stdio-json", executable="harness-demo", model="m-1")


def test_get_unknown_run_raises_run_not_found(store: RunStore) -> None:
    with pytest.raises(RunNotFound):
        store.get(RUN)


def test_begin_turn_refuses_unknown_run(store: RunStore) -> None:
    with pytest.raises(RunNotFound):
        store.begin_turn(RUN)


def test_begin_turn_refuses_busy_run_while_first_turn_in_flight(created: RunStore) -> None:
    with pytest.raises(RunBusy, match="turn 1"):
        created.begin_turn(RUN)


def test_begin_turn_increments_turns_when_idle(created: RunStore) -> None:
    assert _finish(created, 1, (0, 0, 0, None))
    assert created.get(RUN)["status"] == "idle"
    assert created.begin_turn(RUN) == 2
    record = created.get(RUN)
    assert (record["turns"], record["current_turn"], record["status"]) == (2, 2, "running")
    with pytest.raises(RunBusy):
        created.begin_turn(RUN)
    assert created.get(RUN)["turns"] == 2


@pytest.mark.parametrize("status", ["ended", "failed"])
def test_begin_turn_refuses_finished_run(created: RunStore, status: str) -> None:
    if status == "ended":
        created.end_run(RUN)
    else:
        _finish(created, 1, (0, 0, 0, None), status="failed")
    with pytest.raises(RunEnded) as caught:
        created.begin_turn(RUN)
    assert caught.value.status == status
    assert created.get(RUN)["turns"] == 1


def test_finish_turn_adds_usage_to_totals(created: RunStore) -> None:
    _finish(created, 1, (10, 5, 2, None))
    created.begin_turn(RUN)
    _finish(created, 2, (7, 3, 1, None))
    record = created.get(RUN)
    assert (record["input_tokens"], record["output_tokens"]) == (17, 8)
    assert record["cached_input_tokens"] == 3


def test_finish_turn_keeps_cost_null_until_priced(created: RunStore) -> None:
    _finish(created, 1, (10, 5, 0, None))
    assert created.get(RUN)["cost_usd"] is None
    created.begin_turn(RUN)
    _finish(created, 2, (1, 1, 0, 0.5))
    assert created.get(RUN)["cost_usd"] == pytest.approx(0.5)
    created.begin_turn(RUN)
    _finish(created, 3, (1, 1, 0, 0.25))
    assert created.get(RUN)["cost_usd"] == pytest.approx(0.75)
    created.begin_turn(RUN)
    _finish(created, 4, (1, 1, 0, None))
    assert created.get(RUN)["cost_usd"] == pytest.approx(0.75)


def test_finish_turn_records_zero_cost_when_priced_free(created: RunStore) -> None:
    _finish(created, 1, (1, 1, 0, 0.0))
    assert created.get(RUN)["cost_usd"] == 0.0


def test_a_turn_ends_once_and_its_usage_counts_once(created: RunStore) -> None:
    assert _finish(created, 1, (4, 0, 0, None)) is True
    created.begin_turn(RUN)
    assert _finish(created, 1, (4, 0, 0, None)) is False  # a late second end of turn 1
    record = created.get(RUN)
    assert record["status"] == "running"  # turn 2's, untouched
    assert record["input_tokens"] == 4
    assert _finish(created, 2, (0, 0, 0, None)) is True
    assert created.get(RUN)["status"] == "idle"


def test_finish_turn_sets_failed_when_asked(created: RunStore) -> None:
    _finish(created, 1, (0, 0, 0, None), status="failed")
    assert created.get(RUN)["status"] == "failed"


def test_a_turn_in_flight_ends_with_its_run_and_its_owners_late_usage_counts(
    created: RunStore, client: fakeredis.FakeRedis
) -> None:
    client.set(created.keys.turn_started(RUN, 1), "w/1")  # a worker holds turn 1
    created.end_run(RUN)
    entries = client.xrange(created.keys.events(RUN))
    assert [fields["type"] for _, fields in entries] == ["turn-started", "session-error"]
    assert json.loads(entries[-1][1]["data"])["reason"] == "cancelled"
    done, why = created.end_turn(
        RUN, 1, caller="owner:w/1", status="idle", header="{}",
        terminal=("turn-complete", "{}"), usage=(3, 1, 0, None),
        changes={"last_error": "late"}, maxlen=1000, mark_ttl_s=60,
    )  # fmt: skip
    assert (done, why) == (False, "ended")
    record = created.get(RUN)
    assert record["status"] == "ended"
    assert record["input_tokens"] == 3  # its harness spent them
    assert record["last_error"] is None
    assert len(client.xrange(created.keys.events(RUN))) == 2
    assert _finish(created, 1, (5, 0, 0, None)) is False  # anyone else's: nothing
    assert created.get(RUN)["input_tokens"] == 3


def test_finish_turn_writes_fields(created: RunStore) -> None:
    _finish(
        created,
        1,
        (0, 0, 0, None),
        changes={
            "session_id": "s-1",
            "resumed": True,
            "model_reported": "demo-1",
            "carry": {"a": 1},
        },
    )
    record = created.get(RUN)
    assert record["session_id"] == "s-1"
    assert record["resumed"] is True
    assert record["model_reported"] == "demo-1"
    assert record["carry"] == {"a": 1}


def test_update_encodes_values_and_touches_updated_at(created: RunStore) -> None:
    before = created.get(RUN)["updated_at"]
    created.update(RUN, container_id=None, resumed=False, warnings=["w"])
    record = created.get(RUN)
    assert record["container_id"] is None
    assert record["resumed"] is False
    assert record["warnings"] == ["w"]
    assert record["updated_at"] >= before


def test_decode_types_each_kind_of_field() -> None:
    raw = {
        "run_id": RUN,
        "turns": "3",
        "input_tokens": "12",
        "cost_usd": "0.125",
        "created_at": "1700000000.5",
        "resumed": "1",
        "options": '{"harness": "pi"}',
        "carry": "{}",
        "session_id": "",
        "status": "idle",
    }
    record = RunRecord.decode(raw).as_dict()
    assert record["turns"] == 3 and isinstance(record["turns"], int)
    assert record["input_tokens"] == 12
    assert record["cost_usd"] == 0.125
    assert record["created_at"] == 1700000000.5
    assert record["resumed"] is True
    assert record["options"] == RunOptions(harness="pi").model_dump(mode="json")
    assert record["carry"] == {}
    assert record["session_id"] is None
    assert record["status"] == "idle"
    assert record["last_error"] is None  # every contract field present, null when unknown
    assert set(CONTRACT_FIELDS) <= set(record)


def test_decode_resumed_false_when_zero() -> None:
    assert RunRecord.decode({"run_id": RUN, "status": "idle", "resumed": "0"}).resumed is False


def test_decode_ignores_fields_it_does_not_know() -> None:
    record = RunRecord.decode({"run_id": RUN, "status": "idle", "later_field": "x"})
    assert "later_field" not in record.as_dict()


def test_encode_then_decode_gives_the_same_record(created: RunStore) -> None:
    created.update(RUN, resumed=True, warnings=["w"], carry={"a": [1]}, lease_until=12.5)
    record = created.record(RUN)
    assert RunRecord.decode(record.encode()) == record
    assert record.options == RunOptions(
        harness="stdio-json", executable="harness-demo", model="m-1"
    )


def test_record_changes_are_typed_as_the_record_declares() -> None:
    declared = typing.get_type_hints(RecordChanges)
    fields = RunRecord.model_fields
    assert {name: fields[name].annotation for name in declared} == declared


def test_status_dict_has_every_field_null_when_unknown(created: RunStore) -> None:
    record = created.get(RUN)
    assert list(record) == list(RunRecord.model_fields)
    assert (record["lease_until"], record["warnings"], record["resumed"]) == (None, None, None)
    assert record["carry"] == {}


def test_a_hash_without_status_is_no_record(created: RunStore, client: fakeredis.FakeRedis) -> None:
    client.delete(KEYS.run(RUN))
    client.hset(KEYS.run(RUN), "input_tokens", "3")
    assert created.find(RUN) is None
    with pytest.raises(RunNotFound):
        created.get(RUN)


def test_finish_turn_leaves_a_deleted_record_deleted(
    created: RunStore, client: fakeredis.FakeRedis
) -> None:
    client.delete(KEYS.run(RUN))
    _finish(created, 1, (3, 1, 0, 0.5), changes={"last_error": "late"})
    assert not client.exists(KEYS.run(RUN))


def test_transcript_appends_in_order(created: RunStore) -> None:
    assert created.transcript(RUN) == []
    created.append_transcript(RUN, 1, "q1", "a1")
    created.append_transcript(RUN, 2, "q2", "a2")
    assert created.transcript(RUN) == [
        {"turn": 1, "input": "q1", "output": "a1"},
        {"turn": 2, "input": "q2", "output": "a2"},
    ]


def test_expire_sets_ttl_on_run_keys(created: RunStore, client: fakeredis.FakeRedis) -> None:
    created.append_transcript(RUN, 1, "q", "a")
    client.xadd(KEYS.events(RUN), {"type": "x"}, id="1-0")
    for key in KEYS.run_keys(RUN):  # the rest (rewinds, permission requests and answers)
        if not client.exists(key):
            client.rpush(key, "{}")
    created.expire(RUN, 100)
    for key in KEYS.run_keys(RUN):
        assert 0 < client.ttl(key) <= 100


def test_a_stored_schema_a_stricter_check_now_refuses_still_reads() -> None:
    """A run made before a schema check grew stricter (a look-ahead RE2 cannot run) stays
    readable: its record is not producer input, and its answers are still checked in bounds."""
    schema = {"type": "string", "pattern": "(?=a)a"}
    with pytest.raises(ValueError, match="pattern"):
        RunOptions(harness="stdio-json", executable="x", output_schema=schema)
    options = json.dumps({"harness": "stdio-json", "executable": "x", "output_schema": schema})
    raw = {"run_id": "r-stored", "harness": "stdio-json", "status": "idle", "options": options}
    record = RunRecord.decode(raw)
    assert record.options is not None and record.options.output_schema == schema
