"""codex adapter against the real codex CLI and the fake model server."""

from __future__ import annotations

from adapters.protocol import TurnRequest
from tests.conformance.conftest import ApiError, RunLiveTurn
from tests.conformance.shared_scenarios import (
    LiveHarness,
    answered_text_turn,
    api_error_turn,
    assert_one_command_ran,
    first_turn_then_resume,
    large_input_call,
)
from tests.fakemodel import TOOL_OUTPUT, USAGE, FakeModelServer

HARNESS = "codex"
MODEL = "gpt-5.5"
#: The shared scenarios name no model: the CLI's default.
LIVE = LiveHarness(HARNESS)


def test_text_turn_reports_answer_usage_and_no_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", model=MODEL))
    done, session, _ = answered_text_turn(turn)
    assert session.model is None
    assert {r.requested_model for r in turn.model_requests()} == {MODEL}
    assert done.model is None and done.cost_usd is None  # codex names no model, prices nothing


def test_base_url_sends_model_traffic_through_the_custom_provider(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer
) -> None:
    turn = run_live_turn(HARNESS, "hi")
    turn.complete  # noqa: B018 -- raises with details when the turn failed
    calls = turn.model_requests()
    assert calls and all(r.api == "responses" and r.path == "/v1/responses" for r in calls)
    assert all(r.headers.get("authorization") == "<redacted>" for r in calls)


def test_tool_turn_runs_the_command_unsandboxed_in_auto_posture(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[scenario:tool] run it", posture="auto", model=MODEL)
    )
    assert TOOL_OUTPUT in turn.complete.text
    assert_one_command_ran(turn)
    assert "`danger-full-access`" in turn.model_requests()[0].body_text()


def test_strict_posture_runs_commands_in_codex_read_only_sandbox(
    run_live_turn: RunLiveTurn,
) -> None:
    # Here (a host with user namespaces) codex's bubblewrap sandbox starts; in a hardened
    # container it cannot, and the command fails closed instead.
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[scenario:tool] run it", posture="strict", model=MODEL)
    )
    assert "`read-only`: The sandbox only permits reading files" in (
        turn.model_requests()[0].body_text()
    )
    assert TOOL_OUTPUT in turn.complete.text


def test_second_turn_resumes_the_thread_and_counts_only_its_own_tokens(
    run_live_turn: RunLiveTurn,
) -> None:
    _, second = first_turn_then_resume(run_live_turn, LIVE)
    done = second.complete
    # turn.completed says 240 for the thread; 120 of it was turn one's.
    assert (done.input_tokens, done.output_tokens) == (USAGE.input_tokens, USAGE.output_tokens)
    assert second.state.carry["input_tokens"] == 2 * USAGE.input_tokens


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = "-p --help " + "x" * (1024 * 1024 - 10)  # codex takes at most 1048576 chars
    call = large_input_call(run_live_turn, LIVE, text)
    assert any(t.startswith("-p --help xxx") and len(t) >= len(text) for t in call.user_texts())


def test_input_over_the_cli_limit_ends_as_invalid_input(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, "x" * (1024 * 1024 + 1))
    assert (turn.error.reason, turn.error.retryable) == ("invalid-input", False)
    assert turn.model_requests() == []


def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn, api_error: ApiError
) -> None:
    api_error_turn(run_live_turn, LIVE, api_error, timeout=150)
