"""codex adapter against the real codex CLI and the fake model server."""

from __future__ import annotations

import pytest

from adapters.protocol import TurnRequest
from tests.conformance.conftest import RunLiveTurn
from tests.fakemodel import TEXT_ANSWER, TOOL_OUTPUT, USAGE, FakeModelServer
from tests.fakemodel.clis import STALE_SESSION

HARNESS = "codex"
MODEL = "gpt-5.5"


def test_text_turn_reports_answer_usage_and_no_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", model=MODEL))
    done = turn.complete
    assert done.text == TEXT_ANSWER
    (session,) = turn.of_type("session")
    assert (session.session_id, session.resumed, session.model) == (done.session_id, False, None)
    assert {r.requested_model for r in turn.model_requests()} == {MODEL}
    assert done.model is None and done.cost_usd is None  # codex names no model, prices nothing
    (usage,) = turn.of_type("usage")
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (
        USAGE.input_tokens,
        USAGE.cached_input_tokens,
        USAGE.output_tokens,
    )


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
    (activity,) = turn.of_type("sandbox-activity")
    assert activity.kind == "command" and "tool-ran" in activity.description
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
    first = run_live_turn(HARNESS, "remember the word PELICAN")
    thread = first.complete.session_id
    second = run_live_turn(
        HARNESS,
        TurnRequest(
            input="what was the word?", turn=2, resume_session=thread, carry=first.state.carry
        ),
        placement=first.placement,
    )
    done = second.complete
    assert done.session_id == thread
    assert second.of_type("session")[0].resumed is True
    (call,) = second.model_requests()
    assert any("PELICAN" in text for text in call.user_texts())
    assert TEXT_ANSWER in call.assistant_texts()
    # turn.completed says 240 for the thread; 120 of it was turn one's.
    assert (done.input_tokens, done.output_tokens) == (USAGE.input_tokens, USAGE.output_tokens)
    assert second.state.carry["input_tokens"] == 2 * USAGE.input_tokens


def test_stale_thread_is_rejected_for_a_fresh_retry(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", resume_session=STALE_SESSION[HARNESS]))
    assert turn.error.reason == "harness-error"
    assert turn.state.resume_rejected is True
    assert turn.model_requests() == []


def test_system_prompt_lands_in_a_developer_message_not_the_user_message(
    run_live_turn: RunLiveTurn,
) -> None:
    marker = 'SYSTEM-MARKER-7f3a: "quoted" \\ and\nnewline'
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", system_prompt=marker))
    turn.complete  # noqa: B018
    (call,) = turn.model_requests()
    assert marker in call.system_text()
    assert all(marker not in text for text in call.user_texts())


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = "-p --help " + "x" * (1024 * 1024 - 10)  # codex takes at most 1048576 chars
    turn = run_live_turn(HARNESS, text)
    turn.complete  # noqa: B018
    (call,) = turn.model_requests()
    assert any(t.startswith("-p --help xxx") and len(t) >= len(text) for t in call.user_texts())


def test_input_over_the_cli_limit_ends_as_invalid_input(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, "x" * (1024 * 1024 + 1))
    assert (turn.error.reason, turn.error.retryable) == ("invalid-input", False)
    assert turn.model_requests() == []


@pytest.mark.parametrize(
    ("scenario", "reason", "retryable"),
    [
        ("http-429", "rate-limited", True),
        ("http-401", "auth", False),
        ("quota", "quota", False),
        ("http-500", "harness-error", True),
    ],
)
def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn, scenario: str, reason: str, retryable: bool
) -> None:
    turn = run_live_turn(HARNESS, f"[scenario:{scenario}] hi", timeout=150)
    error = turn.error
    assert (error.reason, error.retryable) == (reason, retryable), turn.describe()


def test_turn_stopped_mid_stream_leaves_a_resumable_thread(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, "remember the word HERON")
    thread = first.complete.session_id
    stopped = run_live_turn(
        HARNESS,
        TurnRequest(input="[scenario:slow] [delay:5] go on", turn=2, resume_session=thread),
        placement=first.placement,
        timeout=8,
    )
    assert stopped.timed_out and stopped.error.reason == "timeout"
    third = run_live_turn(
        HARNESS,
        TurnRequest(input="and now?", turn=3, resume_session=thread),
        placement=first.placement,
    )
    assert third.of_type("session")[0].resumed is True
    assert any("HERON" in t for t in third.model_requests()[-1].user_texts())
