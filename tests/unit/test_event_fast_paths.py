"""The per-event fast paths of a flood (docs/performance.md, rows 2 and 8) say exactly what
the general paths say: an assistant-text's data byte for byte, a budget's crossing at the
same event with the same figures, the read loop's slices the same events in the same order."""

from __future__ import annotations

import random

import pytest

from adapters.events import (
    AssistantText,
    Event,
    PermissionRequest,
    SandboxActivity,
    Session,
    ToolResult,
    Usage,
    _Event,
)
from config import load_settings
from worker.spend import budgets
from worker.spend.budgets import UsageTotals
from worker.store.records import RunRecord


def _general(event: AssistantText) -> str:
    return _Event.data_json(event)


def test_assistant_text_data_is_the_general_serialisers_for_every_code_point() -> None:
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for at in range(0, len(chars), 4096):
        event = AssistantText(text="".join(chars[at : at + 4096]))
        assert event.data_json() == _general(event)
    for text in ["", "plain", 'q"uote\\back\nnl\ttab\x00\x1f\x7f', "é漢😀"]:
        assert AssistantText(text=text).data_json() == _general(AssistantText(text=text))


def test_a_lone_surrogate_takes_the_general_path() -> None:
    assert AssistantText(text="a\ud800b").data_json() == '{"text":"a?b"}'


def _stream(rng: random.Random, count: int) -> list[Event]:
    out: list[Event] = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.6:
            out.append(AssistantText(text="x" * rng.randrange(0, 40)))
        elif pick < 0.75:
            cost = rng.choice([None, 0.0, 0.001, 0.01])
            out.append(
                Usage(
                    input_tokens=rng.randrange(0, 50),
                    output_tokens=rng.randrange(0, 50),
                    cost_usd=cost,
                )
            )
        elif pick < 0.85:
            out.append(SandboxActivity(kind="command", description="d" * rng.randrange(0, 30)))
        elif pick < 0.9:
            out.append(PermissionRequest(request_id="1", description="p" * rng.randrange(0, 30)))
        elif pick < 0.95:
            out.append(Session(session_id="s", resumed=False))
        else:
            out.append(ToolResult(call_id="c", ok=True, output="o", output_chars=1, duration_ms=1))
    return out


SessionError_ = str | None


def _per_event(
    guard: budgets.Guard, batches: list[list[Event]]
) -> tuple[int, SessionError_, UsageTotals]:
    totals = UsageTotals()
    for number, batch in enumerate(batches):
        for event in batch:
            if isinstance(event, Usage):
                totals.add(event)
            halt = guard.on_event(event, totals)
            if halt is not None:
                return number, halt.error, totals
    return -1, None, totals


def _batched(
    guard: budgets.Guard, batches: list[list[Event]]
) -> tuple[int, SessionError_, UsageTotals]:
    totals = UsageTotals()
    for number, batch in enumerate(batches):
        if guard.clear(batch, totals):
            for event in batch:
                if isinstance(event, Usage):
                    totals.add(event)
            continue
        for event in batch:
            if isinstance(event, Usage):
                totals.add(event)
            halt = guard.on_event(event, totals)
            if halt is not None:
                return number, halt.error, totals
    return -1, None, totals


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_cleared_by_the_guard_is_one_no_event_of_it_would_stop(seed: int) -> None:
    rng = random.Random(seed)
    events = _stream(rng, 400)
    batches: list[list[Event]] = []
    at = 0
    while at < len(events):
        size = rng.randrange(1, 60)
        batches.append(events[at : at + size])
        at += size
    budget: dict[str, float] = rng.choice(
        [
            {"max_tokens": rng.randrange(100, 5000)},
            {"max_cost_usd": rng.choice([0.005, 0.05, 0.5])},
            {"max_tokens": rng.randrange(100, 5000), "max_cost_usd": 0.05},
            {"max_turns": 3},
            {},
        ]
    )
    record = RunRecord(
        run_id="r" + "a" * 24, status="running", budget=budget, input_tokens=rng.randrange(0, 200)
    )
    settings = load_settings()
    one, other = budgets.Guard(record, settings), budgets.Guard(record, settings)
    assert _batched(one, batches) == _per_event(other, batches)
    assert one.over == other.over
    if "max_tokens" in budget:  # the estimate counts only against max_tokens
        assert one._estimate == other._estimate
