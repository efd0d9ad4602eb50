"""claude-code adapter against the real Claude Code CLI and the fake model server."""

from __future__ import annotations

import pytest

from adapters.protocol import TurnRequest
from tests.conformance.conftest import RunLiveTurn
from tests.fakemodel import RETRY_AFTER_S, TEXT_ANSWER, TOOL_OUTPUT, USAGE, FakeModelServer
from tests.fakemodel.clis import FAKE_KEY, STALE_SESSION

HARNESS = "claude-code"
MODEL = "claude-sonnet-4-5"
#: The CLI retries 429/5xx ten times over minutes; tests of the error path ask for none.
NO_RETRIES = {"ANTHROPIC_API_KEY": FAKE_KEY, "CLAUDE_CODE_MAX_RETRIES": "0"}


def test_text_turn_reports_answer_usage_cost_and_answering_model(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[answer-model:claude-other-9] hi", model=MODEL)
    )
    done = turn.complete
    assert done.text == TEXT_ANSWER
    (session,) = turn.of_type("session")
    assert (session.session_id, session.resumed) == (done.session_id, False)
    # Requested one model, the API said another answered: the stream's message.model wins.
    assert {r.requested_model for r in turn.model_requests()} == {MODEL}
    assert done.model == session.model == "claude-other-9"
    (usage,) = turn.of_type("usage")
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (
        USAGE.input_tokens,
        USAGE.cached_input_tokens,
        USAGE.output_tokens,
    )
    assert usage.cost_usd is not None and usage.cost_usd > 0
    assert done.cost_usd == usage.cost_usd


def test_base_url_sends_model_traffic_to_the_given_endpoint(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer
) -> None:
    turn = run_live_turn(HARNESS, "hi")
    turn.complete  # noqa: B018 -- raises with details when the turn failed
    assert turn.command.env["ANTHROPIC_BASE_URL"] == fake_model.url
    assert [r.api for r in turn.model_requests()] and all(
        r.api == "anthropic" for r in turn.model_requests()
    )


def test_tool_turn_runs_the_command_and_answers_with_its_output(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, TurnRequest(input="[scenario:tool] run it", posture="dangerous"))
    assert turn.complete.text.endswith(TOOL_OUTPUT)
    (activity,) = turn.of_type("sandbox-activity")
    assert activity.kind == "command" and "tool-ran" in activity.description


def test_denied_command_is_reported_as_a_permission_request(run_live_turn: RunLiveTurn) -> None:
    # Read-only commands such as echo need no approval even in strict: deny this one.
    turn = run_live_turn(
        HARNESS,
        TurnRequest(input="[scenario:tool] run it", posture="strict", deny=("Bash(echo:*)",)),
    )
    (request,) = turn.of_type("permission-request")
    assert request.command is not None and "tool-ran" in request.command
    assert TOOL_OUTPUT not in turn.complete.text


def test_allow_pattern_lets_a_command_run_under_strict_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(
        HARNESS,
        TurnRequest(input="[scenario:tool] run it", posture="strict", allow=("Bash(echo:*)",)),
    )
    assert turn.of_type("permission-request") == []
    assert turn.complete.text.endswith(TOOL_OUTPUT)


def test_deny_pattern_blocks_a_command_even_in_dangerous_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[scenario:tool] run it", posture="dangerous", deny=("Bash",))
    )
    assert TOOL_OUTPUT not in turn.complete.text
    assert all("Bash" not in r.tool_names() for r in turn.model_requests()) or turn.of_type(
        "permission-request"
    ), turn.describe()


def test_second_turn_resumes_the_session_with_prior_context(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, "remember the word PELICAN")
    session_id = first.complete.session_id
    second = run_live_turn(
        HARNESS,
        TurnRequest(input="what was the word?", turn=2, resume_session=session_id),
        placement=first.placement,
    )
    assert second.complete.session_id == session_id
    (session,) = second.of_type("session")
    assert session.resumed is True
    assert second.state.resume_rejected is False
    (call,) = second.model_requests()
    assert any("PELICAN" in text for text in call.user_texts())
    assert TEXT_ANSWER in call.assistant_texts()


def test_stale_session_is_rejected_for_a_fresh_retry(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", resume_session=STALE_SESSION[HARNESS]))
    assert turn.error.reason == "harness-error"
    assert turn.state.resume_rejected is True
    assert turn.of_type("session") == []
    assert turn.model_requests() == []


def test_system_prompt_lands_in_the_system_slot_not_the_user_message(
    run_live_turn: RunLiveTurn,
) -> None:
    marker = "SYSTEM-MARKER-7f3a: answer in French."
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", system_prompt=marker))
    turn.complete  # noqa: B018
    (call,) = turn.model_requests()
    assert marker in call.system_text()
    assert all(marker not in text for text in call.user_texts())


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = "-p --help " + "x" * (1024 * 1024)
    turn = run_live_turn(HARNESS, text)
    turn.complete  # noqa: B018
    (call,) = turn.model_requests()
    assert any(t.startswith("-p --help xxx") and len(t) >= len(text) for t in call.user_texts())


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
    turn = run_live_turn(HARNESS, f"[scenario:{scenario}] hi", secrets=NO_RETRIES, timeout=90)
    error = turn.error
    assert (error.reason, error.retryable) == (reason, retryable), turn.describe()
    if scenario == "http-429" and error.retry_after_s is not None:
        assert error.retry_after_s == RETRY_AFTER_S


def test_auth_failure_ends_the_turn_at_the_first_retry_notice(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, "[scenario:http-401] hi", timeout=60)
    assert turn.error.reason == "auth"
    assert turn.duration_s < 30  # the CLI alone would retry for minutes


def test_turn_stopped_mid_stream_leaves_a_resumable_session(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, "remember the word HERON")
    session_id = first.complete.session_id
    stopped = run_live_turn(
        HARNESS,
        TurnRequest(input="[scenario:slow] [delay:5] go on", turn=2, resume_session=session_id),
        placement=first.placement,
        timeout=8,
    )
    assert stopped.timed_out and stopped.error.reason == "timeout"
    third = run_live_turn(
        HARNESS,
        TurnRequest(input="and now?", turn=3, resume_session=session_id),
        placement=first.placement,
    )
    assert third.of_type("session")[0].resumed is True
    assert any("HERON" in t for t in third.model_requests()[-1].user_texts())
