"""What every adapter must do, whatever the harness: map each recorded stream to its golden
events, the same however the bytes arrive; keep the stream rules (the mapper never raises;
exactly one terminal event, the last) on mutated, truncated and reordered streams; tell a
resumed session from a new one and a stale one. Each harness's own file says how its
recordings are replayed (``RECORDED``) and tests what only that harness does."""

from __future__ import annotations

from typing import Any

import pytest
import test_claude_code
import test_codex
import test_gemini
import test_opencode
import test_pi
from helpers import (
    FIXTURES,
    STALE_SESSION_SCENARIO,
    RecordedHarness,
    assert_kept_stream_rules,
    assert_stream_rules,
    by_type,
    check_golden,
    event_dicts,
    fixture_dir,
    json_lines,
    json_values,
    mutated,
    replay,
    stdout_bytes,
    stdout_lines,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapters
from adapters.events import SessionError
from adapters.protocol import AdapterState, ExitInfo, TurnRequest

HARNESSES = [
    test_claude_code.RECORDED,
    test_codex.RECORDED,
    test_gemini.RECORDED,
    test_opencode.RECORDED,
    test_pi.RECORDED,
]
EACH_HARNESS = [pytest.param(harness, id=harness.harness_id) for harness in HARNESSES]
EACH_RECORDING = [
    pytest.param(harness, scenario, id=f"{harness.harness_id}-{scenario}")
    for harness in HARNESSES
    for scenario in harness.scenarios()
]
#: Chunk sizes that split lines, UTF-8 sequences and JSON tokens in many places.
CHUNK_SIZES = (3, 5, 7, 11)


@pytest.mark.parametrize(("harness", "scenario"), EACH_RECORDING)
def test_recorded_stream_maps_to_golden_events(harness: RecordedHarness, scenario: str) -> None:
    events, driver = harness.run(scenario)
    assert_kept_stream_rules(events, driver)
    state = driver.state
    check_golden(
        fixture_dir(harness.harness_id) / f"{scenario}.events.json",
        {
            "events": event_dicts(events),
            "state": {
                "session_id": state.session_id,
                "model": state.model,
                "resume_rejected": state.resume_rejected,
                "carry": state.carry,
            },
            "counters": driver.counters.as_dict(),
        },
    )


@pytest.mark.parametrize(("harness", "scenario"), EACH_RECORDING)
def test_recorded_stream_maps_the_same_when_fed_in_small_chunks(
    harness: RecordedHarness, scenario: str
) -> None:
    whole, _ = harness.run(scenario)
    for chunk_size in CHUNK_SIZES:
        chunked, _ = replay(
            harness.adapter,
            harness.request_for(scenario),
            stdout_bytes(harness.harness_id, scenario),
            harness.recorded_exit(scenario),
            chunk_size,
        )
        assert event_dicts(chunked) == event_dicts(whole), f"in chunks of {chunk_size}"


@pytest.mark.parametrize("harness", EACH_HARNESS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mapper_never_raises_nor_emits_two_terminals_on_mutated_messages(
    harness: RecordedHarness, data: st.DataObject
) -> None:
    seeds = st.sampled_from(harness.messages()).flatmap(mutated)
    messages: list[Any] = data.draw(st.lists(seeds | json_values(), max_size=8), "messages")
    sessions = [None, harness.session, harness.stale_session]
    offered = data.draw(st.sampled_from(sessions), "offered session")
    carry = data.draw(st.sampled_from(harness.carries), "carry")
    code = data.draw(st.sampled_from([0, 1, None]), "exit code")
    stale_stderr = harness.recorded_exit(STALE_SESSION_SCENARIO).stderr_tail
    stderr = data.draw(st.sampled_from(["", stale_stderr]), "stderr")
    assert_stream_rules(
        harness.adapter,
        harness.request_for("x", resume_session=offered, carry=carry),
        json_lines(*messages),
        ExitInfo(exit_code=code, stderr_tail=stderr),
    )


@pytest.mark.parametrize("harness", EACH_HARNESS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_truncated_and_reordered_real_streams_keep_one_terminal(
    harness: RecordedHarness, data: st.DataObject
) -> None:
    scenario = data.draw(st.sampled_from(harness.scenarios()), "scenario")
    cut = data.draw(st.integers(min_value=0), "cut")
    rnd = data.draw(st.randoms(), "random")
    request = harness.request_for(scenario)
    stdout = stdout_bytes(harness.harness_id, scenario)
    truncated = stdout[: cut % (len(stdout) + 1)]
    lines = stdout_lines(harness.harness_id, scenario)
    rnd.shuffle(lines)
    for code in (0, 1):
        assert_stream_rules(harness.adapter, request, truncated, ExitInfo(exit_code=code))
        assert_stream_rules(harness.adapter, request, lines, ExitInfo(exit_code=code))


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_offered_session_is_resumed_only_when_the_harness_continues_it(
    harness: RecordedHarness,
) -> None:
    resumed, driver = harness.run("ref-resume")
    assert by_type(resumed, "session")[0].resumed is True
    assert driver.state.resume_rejected is False
    fresh, _ = harness.run("ref-resume", resume_session=None)
    assert by_type(fresh, "session")[0].resumed is False
    other, _ = harness.run("ref-resume", resume_session=harness.stale_session)
    assert by_type(other, "session")[0].resumed is False


@pytest.mark.parametrize("harness", EACH_HARNESS)
def test_stale_session_is_told_from_the_cli_stderr_and_exit_alone(
    harness: RecordedHarness,
) -> None:
    request = harness.request_for("x", resume_session=harness.stale_session)
    exit = harness.recorded_exit(STALE_SESSION_SCENARIO)
    events, driver = replay(harness.adapter, request, b"", exit)
    assert driver.state.resume_rejected is True
    assert isinstance(events[-1], SessionError)
    assert events[-1].exit_code == exit.exit_code


@pytest.mark.parametrize("harness", EACH_HARNESS)
@pytest.mark.parametrize("exit", [ExitInfo(exit_code=1, stderr_tail="?"), ExitInfo(exit_code=3)])
def test_exit_without_anything_known_leaves_the_generic_exit_error(
    harness: RecordedHarness, exit: ExitInfo
) -> None:
    events, _ = replay(harness.adapter, harness.request_for("x"), b"", exit)
    assert isinstance(events[-1], SessionError)
    assert (events[-1].reason, events[-1].exit_code) == ("exit", exit.exit_code)


def test_every_harness_with_recordings_is_replayed_here() -> None:
    recorded = {path.name for path in FIXTURES.iterdir() if path.is_dir()}
    assert {harness.harness_id for harness in HARNESSES} == recorded


@pytest.mark.parametrize("harness_id", adapters.HARNESS_IDS)
def test_state_is_an_adapter_state_the_worker_can_read(harness_id: str) -> None:
    adapter = adapters.get(harness_id)
    state = adapter.new_state(TurnRequest(input="hi", resume_session="s-1", executable="x"))
    assert isinstance(state, AdapterState)
    assert (state.session_id, state.resume_rejected, state.carry) == (None, False, {})
