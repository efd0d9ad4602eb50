"""A harness whose ``--posture ask`` is another CLI mode: ``adapters.get`` gives one adapter
that runs the ask mode's module for an ask turn and the one-shot module for the others."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import test_claude_code
import test_codex
import test_gemini
import test_opencode
import test_pi
from helpers import RecordedHarness

import adapters
from adapters.asks import Ask, Decision
from adapters.protocol import ExitInfo, TurnRequest

RECORDED: dict[str, RecordedHarness] = {
    r.harness_id: r
    for r in (
        test_claude_code.RECORDED,
        test_codex.RECORDED,
        test_gemini.RECORDED,
        test_opencode.RECORDED,
        test_pi.RECORDED,
    )
}
TWO_MODES = sorted(adapters.ASK_MODULES)


def _module(name: str) -> object:
    return importlib.import_module(f"adapters.{name}")


def test_every_harness_but_stdio_json_has_an_ask_mode_module() -> None:
    assert set(TWO_MODES) == set(adapters.HARNESS_IDS) - {"stdio-json"}
    assert adapters.get("stdio-json") is _module("stdio_json")


@pytest.mark.parametrize("harness", TWO_MODES)
def test_an_ask_turn_is_the_ask_modules_and_the_others_the_one_shot_modules(harness: str) -> None:
    adapter = adapters.get(harness)
    assert adapters.get(harness) is adapter  # one object: what the worker flips and reads
    one_shot, ask_mode = adapters.MODULES[harness], adapters.ASK_MODULES[harness]
    assert (adapter.HARNESS_ID, adapter.CAPABILITIES) == (
        _module(one_shot).HARNESS_ID,  # type: ignore[attr-defined]
        _module(one_shot).CAPABILITIES,  # type: ignore[attr-defined]
    )
    ask = TurnRequest("q", posture="ask", model="m", executable="x")
    auto = dataclasses.replace(ask, posture="auto")
    assert type(adapter.new_state(ask)).__module__ == f"adapters.{ask_mode}"
    assert type(adapter.new_state(auto)).__module__ == f"adapters.{one_shot}"
    assert adapter.build_command(ask).keep_stdin
    assert not adapter.build_command(auto).keep_stdin


@pytest.mark.parametrize("harness", TWO_MODES)
def test_a_one_shot_turn_through_the_harness_adapter_maps_as_its_module(harness: str) -> None:
    recorded = RECORDED[harness]
    through = dataclasses.replace(recorded, adapter=adapters.get(harness))
    for scenario in ("text", "resume"):
        assert through.run(scenario)[0] == recorded.run(scenario)[0]


@pytest.mark.parametrize("harness", TWO_MODES)
def test_an_ask_turns_answer_and_end_go_to_the_ask_mode(harness: str) -> None:
    adapter = adapters.get(harness)
    state = adapter.new_state(TurnRequest("q", posture="ask", model="m", executable="x"))
    ask_mode = _module(adapters.ASK_MODULES[harness])
    assert adapter.finish(state, ExitInfo(0)) == ask_mode.finish(state, ExitInfo(0))  # type: ignore[attr-defined]
    ask = Ask(
        native_id="r-1",
        tool="bash",
        input={"command": "ls"},
        reply={"options": {"allow_once": "once"}, "method": "execCommandApproval", "input": {}},
    )
    adapter.answer(state, ask, Decision(allow=True))
    assert len(state.outbox) == 1 and b"r-1" in state.outbox[0]
