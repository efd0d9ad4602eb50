"""Budgets, parking and the stdio-json error reasons, without Celery: execute_turn
on fakeredis, the local sandbox and the demo harness; the decisions as pure functions."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from adapters import stdio_json
from adapters.events import SessionError, session_error
from config import load_settings
from tests.unit import test_execute_turn
from tests.unit.test_execute_turn import World
from worker.errors import InvalidInput
from worker.options.spec import RunOptions, TurnPayload
from worker.spend import budgets, parking
from worker.spend.budgets import UsageTotals
from worker.store.records import RunRecord

SENT: list[tuple[dict[str, Any], str, float]] = []

make_world = test_execute_turn.make_world  # the fixture: worlds on fakeredis and LocalSandbox


@pytest.fixture
def world(make_world: Any) -> World:
    made: World = make_world()
    made.deps.send_turn = _capture
    return made


def _capture(payload: dict[str, Any], queue: str, countdown: float) -> None:
    """What the worker would send to the broker (a parked turn, a deferred copy)."""
    SENT.append((payload, queue, countdown))


@pytest.fixture(autouse=True)
def _clear_sends() -> None:
    SENT.clear()


def _types(events: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return [kind for _, kind, _ in events]


def _terminal(world: World, run_id: str, turn: int) -> dict[str, Any]:
    _, kind, data = world.events(run_id, turn)[-1]
    assert kind in ("turn-complete", "session-error")
    return {"type": kind, **data}


def _next_turn(world: World, run_id: str, text: str) -> int:
    """What submit_turn does to the record (begin_turn), without the broker."""
    return world.store.begin_turn(run_id)


# --------------------------------------------------------------------------- budgets: policy


def test_a_limit_above_the_operator_ceiling_is_refused() -> None:
    settings = load_settings(max_run_tokens=1000)
    with pytest.raises(InvalidInput, match="max_tokens 5000 is above the operator's ceiling"):
        budgets.initial(RunOptions(harness="stdio-json", max_tokens=5000), settings)


def test_defaults_then_ceilings_fill_the_limits_a_producer_leaves_out() -> None:
    settings = load_settings(max_run_tokens=1000, run_turns=5, max_run_cost_usd=2.0)
    budget = budgets.initial(RunOptions(harness="stdio-json", max_wall_s=60), settings)
    assert budget == {"max_cost_usd": 2.0, "max_tokens": 1000, "max_turns": 5, "max_wall_s": 60.0}
    assert budgets.initial(RunOptions(harness="stdio-json"), load_settings())["max_tokens"] is None


def test_the_worker_clamps_a_stored_budget_to_the_ceiling() -> None:
    record = RunRecord(run_id="r" + "0" * 24, status="idle", budget={"max_tokens": 10**9})
    assert budgets.effective(record, load_settings(max_run_tokens=500))["max_tokens"] == 500


def test_a_turn_is_refused_when_a_spend_limit_is_reached_or_its_number_is_above_max_turns() -> None:
    used = budgets.Spent(tokens=100, cost_usd=None, turns=3, wall_s=0)
    assert budgets.first_over({"max_tokens": 100}, used, turn_starting=True) is not None
    assert budgets.first_over({"max_tokens": 100}, used, turn_starting=False) is None
    assert budgets.first_over({"max_turns": 3}, used, turn_starting=True) is None
    over = budgets.first_over({"max_turns": 2}, used, turn_starting=True)
    assert over is not None and over.exceeded == {
        "budget": "max_turns",
        "limit": 2.0,
        "used": 3.0,
        "over_by": 1.0,
    }


def test_output_streamed_before_usage_is_reported_counts_as_an_estimate() -> None:
    from adapters.events import AssistantText, Usage

    record = RunRecord(run_id="r" + "0" * 24, status="running", budget={"max_tokens": 10})
    guard = budgets.Guard(record, load_settings())
    turn = UsageTotals()
    assert guard.on_event(AssistantText(text="x" * 36), turn) is None  # about 9 tokens
    error = guard.on_event(AssistantText(text="more text"), turn)
    assert error is not None and "estimated" in error.error
    assert guard.changes()["budget_exceeded"] == {
        "budget": "max_tokens",
        "limit": 10.0,
        "used": 12.0,
        "over_by": 2.0,
        "estimated": True,
    }
    fresh = budgets.Guard(record, load_settings())
    fresh.on_event(AssistantText(text="x" * 36), turn)
    turn.add(Usage(input_tokens=2, output_tokens=3))  # the harness's own count replaces it
    assert fresh.on_event(Usage(input_tokens=2, output_tokens=3), turn) is None


def test_cost_counts_only_what_a_harness_priced() -> None:
    record = RunRecord(run_id="r" + "0" * 24, status="running", budget={"max_cost_usd": 1.0})
    guard = budgets.Guard(record, load_settings())
    assert guard.on_usage(UsageTotals(input_tokens=10**6)) is None  # unpriced: no cost
    error = guard.on_usage(UsageTotals(cost_usd=1.5))
    assert error is not None and error.reason == "budget" and not error.retryable
    assert guard.changes()["budget_exceeded"]["budget"] == "max_cost_usd"


# --------------------------------------------------------------------------- budgets: turns


def test_a_token_budget_stops_the_harness_mid_turn_with_reason_budget(world: World) -> None:
    run_id = world.run(max_tokens=100)
    began = time.monotonic()
    outcome = world.turn(run_id, "@text working\n@usage 100 50\n@sleep 20\n@complete never")
    assert outcome == "failed:budget"
    assert time.monotonic() - began < 10  # stopped, not left to sleep
    terminal = _terminal(world, run_id, 1)
    assert terminal["reason"] == "budget" and terminal["retryable"] is False
    assert "max_tokens 100, used 150" in terminal["error"]
    types = _types(world.events(run_id, 1))
    assert types[:2] == ["turn-started", "session"] and "usage" in types
    record = world.store.record(run_id)
    assert record.budget_exceeded == {
        "budget": "max_tokens",
        "limit": 100.0,
        "used": 150.0,
        "over_by": 50.0,
    }
    assert record.status == "idle" and record.session_id  # the session is kept
    assert (record.input_tokens, record.output_tokens) == (100, 50)


def test_a_spent_budget_refuses_the_next_turn_before_the_harness_runs(world: World) -> None:
    run_id = world.run(max_tokens=100)
    assert world.turn(run_id, "@usage 120 0\n@sleep 20") == "failed:budget"
    turn = _next_turn(world, run_id, "again")
    assert world.turn(run_id, "again", turn=turn) == "failed:budget"
    events = world.events(run_id, turn)
    assert _types(events) == ["turn-started", "session-error"]  # the harness never ran
    assert "before the turn" in events[-1][2]["error"]
    assert world.store.record(run_id).budget_exceeded["budget"] == "max_tokens"  # type: ignore[index]


def test_raising_the_budget_lets_the_next_turn_resume_the_session(world: World) -> None:
    run_id = world.run(max_tokens=100)
    world.turn(run_id, "@usage 100 50\n@sleep 20")
    stopped = world.store.record(run_id)
    world.store.update(run_id, budget={**stopped.budget, "max_tokens": 10_000})
    turn = _next_turn(world, run_id, "go on")
    assert world.turn(run_id, "go on", turn=turn) == "completed"
    (session,) = [data for _, kind, data in world.events(run_id, turn) if kind == "session"]
    assert session["resumed"] is True and session["session_id"] == stopped.session_id


def test_a_wall_clock_budget_stops_a_turn_that_runs_too_long(world: World) -> None:
    run_id = world.run(max_wall_s=1.0)
    began = time.monotonic()
    assert world.turn(run_id, "@sleep 20") == "failed:budget"
    assert time.monotonic() - began < 8
    record = world.store.record(run_id)
    assert record.budget_exceeded["budget"] == "max_wall_s"  # type: ignore[index]
    assert 1.0 <= record.wall_s < 8


def test_replayed_tokens_count_against_the_budget(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "x" * 200) == "completed"
    # The budget set after the first turn (whose streamed answer alone could pass 40 tokens
    # before its usage line is read): only the replay of the next turn is to cross it.
    world.store.update(run_id, budget={**world.store.record(run_id).budget, "max_tokens": 40})
    for path in world.sessions(run_id):  # the vendor session is gone: the turn is replayed
        path.unlink()
    turn = _next_turn(world, run_id, "and now")
    assert world.turn(run_id, "and now", turn=turn) == "failed:budget"
    usage = [data for _, kind, data in world.events(run_id, turn) if kind == "usage"]
    assert usage and usage[0]["source"] == "replay" and usage[0]["input_tokens"] > 40


def test_no_budget_leaves_the_turn_alone(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "@usage 100000 100000\n@complete ok") == "completed"
    assert world.store.record(run_id).budget_exceeded is None


# --------------------------------------------------------------------------- parking: decisions

SETTINGS = load_settings(max_parks=3, park_max_s=100.0, backoff_base_s=2.0, backoff_max_s=10.0)
OPTIONS = RunOptions(harness="stdio-json")
RECORD = RunRecord(run_id="r" + "0" * 24, status="running")


@pytest.mark.parametrize(
    ("terminal", "expected"),
    [
        (session_error("429", "rate-limited", retry_after_s=3.0), 3.0),
        (session_error("quota until reset", "quota", retryable=True, retry_after_s=7.0), 7.0),
        # a spend cap (quota without a reset) is never retried blindly
        (session_error("spend limit reached", "quota"), None),
        (session_error("bad key", "auth"), None),
        (session_error("far away", "rate-limited", retry_after_s=1000.0), None),
    ],
)
def test_what_parks_and_for_how_long(terminal: SessionError, expected: float | None) -> None:
    assert parking.delay_for(terminal, OPTIONS, RECORD, SETTINGS) == expected


def test_a_rate_limit_without_a_reset_backs_off_exponentially_with_jitter() -> None:
    terminal = session_error("overloaded", "rate-limited")
    delays = [
        parking.delay_for(terminal, OPTIONS, RECORD.model_copy(update={"parks": n}), SETTINGS)
        for n in range(3)
    ]
    assert delays[0] is not None and 1.0 <= delays[0] <= 2.0
    assert delays[1] is not None and 2.0 <= delays[1] <= 4.0
    assert delays[2] is not None and 4.0 <= delays[2] <= 8.0
    rng = random.Random(1)
    capped = [parking.backoff_s(20, SETTINGS, rng) for _ in range(50)]
    assert all(5.0 <= d <= 10.0 for d in capped) and len(set(capped)) > 1


def test_parks_are_bounded_and_fail_or_a_spent_budget_does_not_park() -> None:
    terminal = session_error("429", "rate-limited", retry_after_s=1.0)
    spent = RECORD.model_copy(update={"parks": 3})
    assert parking.delay_for(terminal, OPTIONS, spent, SETTINGS) is None
    failing = RunOptions(harness="stdio-json", on_limit="fail")
    assert parking.delay_for(terminal, failing, RECORD, SETTINGS) is None
    assert parking.delay_for(terminal, OPTIONS, RECORD, SETTINGS, next_refused=True) is None
    fail_policy = load_settings(on_limit="fail")
    assert parking.delay_for(terminal, OPTIONS, RECORD, fail_policy) is None
    parks = RunOptions(harness="stdio-json", on_limit="park")
    assert parking.delay_for(terminal, parks, RECORD, fail_policy) == 1.0


# --------------------------------------------------------------------------- parking: turns


def test_a_rate_limited_turn_parks_the_run_and_its_input_is_sent_again(world: World) -> None:
    run_id = world.run()
    script = "@limit 1 rate-limited 2\n@complete done after the reset"
    before = time.time()
    assert world.turn(run_id, script) == "failed:rate-limited"
    events = world.events(run_id, 1)
    assert _types(events)[-2:] == ["parked", "session-error"]  # one terminal, last
    parked = events[-2][2]
    assert parked["reason"] == "rate-limited" and parked["next_turn"] == 2
    assert before + 2 <= parked["resume_at"] <= time.time() + 2
    record = world.store.record(run_id)
    assert (record.status, record.current_turn, record.turns, record.parks) == ("parked", 2, 2, 1)
    assert record.resume_at == parked["resume_at"]
    ((payload, queue, countdown),) = SENT
    payload = {**payload, "attachments": list(payload["attachments"])}
    payload["messages"] = list(payload["messages"])
    assert payload == {
        "run_id": run_id,
        "turn": 2,
        "input": script,
        "not_before": parked["resume_at"],
        "messages": [],
        "attachments": [],
        "output_schema": None,
    }
    assert queue == "q" and 1.5 <= countdown <= 2.0
    queued = json.loads(world.client.get(world.keys.turn_queued(run_id, 2)) or "{}")
    assert queued["payload"] == payload  # what the reaper sends should the countdown be lost

    # At the reset: the same input, the same session, and the run goes on.
    resent = TurnPayload.model_validate({**payload, "not_before": time.time() - 0.1})
    from worker.turn.execute import execute_turn

    assert execute_turn(world.deps, resent) == "completed"
    (session,) = [d for _, k, d in world.events(run_id, 2) if k == "session"]
    assert session["resumed"] is True and session["session_id"] == record.session_id
    after = world.store.record(run_id)
    assert (after.status, after.resume_at) == ("idle", None)


def test_a_copy_delivered_before_the_reset_is_sent_on_not_run(world: World) -> None:
    run_id = world.run()
    world.turn(run_id, "@limit 1 rate-limited 30\n@complete ok")
    ((payload, _, _),) = SENT
    from worker.turn.execute import execute_turn

    early = TurnPayload.model_validate(payload)
    assert execute_turn(world.deps, early) == "deferred"
    assert len(SENT) == 2 and 28 < SENT[1][2] <= 30  # sent on, to run at the reset
    assert not world.client.exists(world.keys.turn_started(run_id, 2))
    assert world.store.record(run_id).status == "parked"


def test_a_quota_without_a_reset_time_fails_the_turn_and_does_not_park(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "@limit 1 quota\n@complete ok") == "failed:quota"
    assert "parked" not in _types(world.events(run_id))
    assert world.store.record(run_id).status == "idle" and SENT == []


def test_a_run_whose_budget_is_spent_is_not_parked(world: World) -> None:
    run_id = world.run(max_turns=1)
    assert world.turn(run_id, "@limit 1 rate-limited 1\n@complete ok") == "failed:rate-limited"
    assert world.store.record(run_id).status == "idle" and SENT == []


# --------------------------------------------------------------------------- stdio-json


@pytest.mark.parametrize(
    ("line", "reason", "retryable", "after"),
    [
        ({"reason": "rate-limited", "retry_after_s": 2}, "rate-limited", True, 2.0),
        ({"reason": "quota", "retry_after_s": 60}, "quota", True, 60.0),
        ({"reason": "quota"}, "quota", False, None),
        ({"reason": "auth"}, "auth", False, None),
        ({"reason": "cancelled"}, "harness-error", False, None),  # the worker's to say
        ({"reason": "budget"}, "harness-error", False, None),
        ({"reason": "rate-limited", "retry_after_s": "soon"}, "rate-limited", True, None),
        ({"retry_after_s": -1}, "harness-error", False, None),
    ],
)
def test_a_stdio_json_error_line_may_carry_a_reason_and_retry_after(
    line: dict[str, Any], reason: str, retryable: bool, after: float | None
) -> None:
    state = stdio_json.new_state(stdio_json_request())
    (event,) = stdio_json.map_message({"type": "error", "message": "m", **line}, state)
    assert isinstance(event, SessionError)
    assert (event.reason, event.retryable, event.retry_after_s) == (reason, retryable, after)


def stdio_json_request() -> Any:
    from adapters.protocol import TurnRequest

    return TurnRequest(input="x", turn=1, workspace="/w", home="/w/.home", executable="h")


# --------------------------------------------------------------------------- docs


def test_the_spend_timing_table_in_the_docs_matches_the_adapters() -> None:
    import adapters
    from tests.unit.test_docs import ROOT, section, table_rows, ticked

    rows = table_rows(section((ROOT / "docs" / "adapters.md").read_text(), "spend-timing"))
    documented = {ticked(row[0])[0]: row[2] for row in rows}
    assert set(documented) == set(adapters.HARNESS_IDS) == set(budgets.COST_AT_END)
    for harness, cost in documented.items():
        priced = adapters.capabilities(harness)["cost_reporting"]
        assert (cost == "never") == (not priced), harness
        assert (cost == "at the end of the turn only") == budgets.COST_AT_END[harness], harness


# --------------------------------------------------------------------------- rendering


def test_follow_shows_a_park_and_a_budget_stop_for_a_person() -> None:
    import io

    from worker.cli.render import Renderer, parked_text, slot_text
    from worker.client import StreamEvent

    now = time.time()
    text = parked_text({"resume_at": now + 90, "reason": "quota", "next_turn": 4}, now)
    assert text.startswith("parked (quota): the worker sends this input again as turn 4 at ")
    assert text.endswith("(in 1m30s)") or "in 1m" in text
    notice = {"grant": "K", "limit": 2, "place": 3, "waiting": 5, "since": now - 5}
    assert slot_text(notice, now).startswith(
        "waiting for a slot of K (at most 2 turns at once on that key): place 3 of 5 waiting"
    )
    out = io.StringIO()
    renderer = Renderer(False, out, terminal=False, err=io.StringIO())
    event = StreamEvent("1-2", "parked", {"resume_at": now + 2, "reason": "rate-limited",
                                          "next_turn": 2}, now)  # fmt: skip
    renderer.event(event)
    stop = session_error("the run's budget is spent during the turn: max_tokens 5", "budget")
    renderer.event(StreamEvent("1-3", "session-error", stop.data(), now))
    renderer.close()
    shown = out.getvalue()
    assert "parked (rate-limited)" in shown and "as turn 2" in shown
    assert "budget" in shown and "max_tokens 5" in shown
