"""A metric for every way a turn waits or stops: execute_turn on fakeredis, the local
sandbox and the demo harness, read back from prometheus-client's registry."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.unit import test_execute_turn
from tests.unit.test_execute_turn import World
from worker.observe import metrics
from worker.store.queued import QueuedTurn

make_world = test_execute_turn.make_world  # the fixture: worlds on fakeredis and LocalSandbox


@pytest.fixture
def world(make_world: Any) -> World:
    made: World = make_world()
    made.deps.send_turn = lambda payload, queue, countdown: None
    return made


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_park_is_counted_by_its_reason(world: World) -> None:
    before = sample("harness_parks_total", harness="stdio-json", reason="rate-limited")
    run_id = world.run()
    assert world.turn(run_id, "@limit 1 rate-limited 2\n@complete later") == "failed:rate-limited"
    after = sample("harness_parks_total", harness="stdio-json", reason="rate-limited")
    assert after == before + 1


def test_budget_stops_are_counted_during_after_and_before_a_turn(world: World) -> None:
    def stops(when: str) -> float:
        return sample(
            "harness_budget_stops_total", harness="stdio-json", budget="max_tokens", when=when
        )

    during, after, before = stops("during"), stops("after"), stops("before")
    stopped = world.run(max_tokens=100)
    assert world.turn(stopped, "@usage 100 50\n@sleep 20") == "failed:budget"
    assert stops("during") == during + 1
    spent = world.run(max_tokens=100)
    assert world.turn(spent, "@usage 60 40\n@complete spent") == "completed"
    assert stops("after") == after + 1
    turn = world.store.begin_turn(spent)
    assert world.turn(spent, "again", turn=turn) == "failed:budget"
    assert stops("before") == before + 1


def test_the_queue_wait_is_observed_from_the_first_send(world: World) -> None:
    count = sample("harness_turn_queue_wait_seconds_count", harness="stdio-json")
    total = sample("harness_turn_queue_wait_seconds_sum", harness="stdio-json")
    run_id = world.run()
    payload = {"run_id": run_id, "turn": 1, "input": "hi"}
    QueuedTurn.first(payload, "q", time.time() - 7).write(world.client, world.keys, run_id, 1, 3600)
    assert world.turn(run_id, "hi") == "completed"
    assert sample("harness_turn_queue_wait_seconds_count", harness="stdio-json") == count + 1
    waited = sample("harness_turn_queue_wait_seconds_sum", harness="stdio-json") - total
    assert 7 <= waited < 60


def test_a_permission_wait_is_counted_by_decision_and_who_decided(make_world: Any) -> None:
    world: World = make_world(permission_timeout_s=1.0)
    before = sample("harness_permission_waits_total", decision="deny", by="worker:deadline")
    run_id = world.run(posture="ask")
    outcome = world.turn(run_id, "@permission write a file\n@complete done")
    assert outcome == "completed"
    assert (
        sample("harness_permission_waits_total", decision="deny", by="worker:deadline")
        == before + 1
    )
    assert sample("harness_permission_wait_seconds_count", decision="deny") >= 1


def test_who_decided_is_cut_to_a_closed_set() -> None:
    def count(by: str) -> float:
        return sample("harness_permission_waits_total", decision="allow", by=by)

    person, rule = count("person"), count("rule:allow")
    metrics.permission_decided("allow", "ada@laptop", 2.0)
    metrics.permission_decided("allow", "rule:allow:Bash(git *)", 0.0)
    assert (count("person"), count("rule:allow")) == (person + 1, rule + 1)


def test_tool_calls_and_webhooks_and_streams_have_their_metrics() -> None:
    ok = sample("harness_tool_calls_total", server="orders", tool="lookup", outcome="ok")
    metrics.tool_called("orders", "lookup", True, 0.2)
    assert (
        sample("harness_tool_calls_total", server="orders", tool="lookup", outcome="ok") == ok + 1
    )
    delivered = sample("harness_webhook_deliveries_total", outcome="delivered")
    metrics.webhook_delivered("delivered")
    assert sample("harness_webhook_deliveries_total", outcome="delivered") == delivered + 1
    open_now = sample("harness_event_streams_open")
    metrics.event_stream_opened()
    assert sample("harness_event_streams_open") == open_now + 1
    metrics.event_stream_closed()
    assert sample("harness_event_streams_open") == open_now


def test_a_slot_wait_is_counted_when_it_begins_and_timed_when_the_slot_is_taken(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.options.spec import RunOptions, TurnPayload
    from worker.spend import slots

    monkeypatch.setenv("DEMO_TOKEN", "tok-slot-metric")
    world: World = make_world(key_slots="DEMO_TOKEN=1")
    options = RunOptions(harness="stdio-json", grants=("DEMO_TOKEN",), producer="p")
    holder, waiter = (TurnPayload(run_id="r" + c * 24, turn=1, input="x") for c in "de")
    for payload in (holder, waiter):
        world.store.create(payload.run_id, options, queue="q", sandbox="local")
    began, taken = sample("harness_slot_waits_total"), sample("harness_slot_wait_seconds_count")
    hold = slots.take(world.deps, holder, options, lambda *_: None)
    assert hold is not None and hold.held
    assert slots.take(world.deps, waiter, options, lambda *_: None) is None
    assert slots.take(world.deps, waiter, options, lambda *_: None) is None  # the same wait
    assert sample("harness_slot_waits_total") == began + 1
    hold.release()
    got = slots.take(world.deps, waiter, options, lambda *_: None)
    assert got is not None and got.held
    got.release()
    assert sample("harness_slot_wait_seconds_count") == taken + 1


def _defined() -> dict[str, str]:
    """Every metric of worker/observe/metrics.py, by its exposed family name: its type."""
    from prometheus_client.metrics import MetricWrapperBase

    return {
        value._name + ("_total" if value._type == "counter" else ""): value._type
        for value in vars(metrics).values()
        if isinstance(value, MetricWrapperBase)
    }


def test_every_metric_is_documented() -> None:
    from tests.conftest import ROOT

    docs = (ROOT / "docs" / "operations.md").read_text() + (
        ROOT / "docs" / "observability.md"
    ).read_text()
    missing = [name for name in _defined() if f"`{name}`" not in docs]
    assert not missing, f"not in docs/operations.md or docs/observability.md: {missing}"


def test_the_dashboard_shows_every_wait_and_stop_and_names_only_real_metrics() -> None:
    import json
    import re

    from tests.conftest import ROOT

    board = json.loads((ROOT / "docs" / "dashboards" / "harness-worker.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    named = {
        re.sub(r"_(bucket|sum|count)$", "", m)
        for e in exprs
        for m in re.findall(r"harness_[a-z_]+", e)
    }
    defined = _defined()
    assert named <= set(defined), named - set(defined)
    waits_and_stops = {
        "harness_turn_queue_wait_seconds", "harness_parks_total", "harness_budget_stops_total",
        "harness_slot_waits_total", "harness_slot_wait_seconds", "harness_permission_waits_total",
        "harness_permission_wait_seconds", "harness_tool_calls_total", "harness_tool_call_seconds",
        "harness_webhook_deliveries_total", "harness_event_streams_open",
    }  # fmt: skip
    assert waits_and_stops <= named
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
