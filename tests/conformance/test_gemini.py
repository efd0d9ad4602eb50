"""gemini adapter against the real Gemini CLI and the fake model server."""

from __future__ import annotations

import pytest

from adapters.protocol import TurnRequest
from tests.conformance.conftest import LiveTurn, RunLiveTurn
from tests.fakemodel import TEXT_ANSWER, TOOL_FINAL_PREFIX, TOOL_OUTPUT, USAGE, FakeModelServer
from tests.fakemodel.clis import STALE_SESSION

HARNESS = "gemini"
MODEL = "gemini-2.5-flash"
SHELL = "run_shell_command"


def test_text_turn_reports_answer_usage_and_answering_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[answer-model:gemini-other-9] hi", model=MODEL)
    )
    done = turn.complete
    assert done.text == TEXT_ANSWER
    (session,) = turn.of_type("session")
    assert (session.session_id, session.resumed) == (done.session_id, False)
    assert {r.requested_model for r in turn.model_requests()} == {MODEL}
    assert done.model == session.model == "gemini-other-9"
    (usage,) = turn.of_type("usage")
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (
        USAGE.input_tokens,
        USAGE.cached_input_tokens,
        USAGE.output_tokens,
    )
    assert done.cost_usd is None


def test_base_url_sends_model_traffic_to_the_given_endpoint(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer
) -> None:
    turn = run_live_turn(HARNESS, TurnRequest(input="hi", model=MODEL))
    turn.complete  # noqa: B018 -- raises with details when the turn failed
    assert turn.command.env["GOOGLE_GEMINI_BASE_URL"] == fake_model.url
    calls = turn.model_requests()
    assert calls and all(r.api == "gemini" for r in calls)


def assert_shell_tool_ran(turn: LiveTurn) -> None:
    # 0.61.0 refuses the fake's `echo tool-ran-$((6*7))` as "command injection" after the
    # policy let it through: the call and its result are what show the posture at work.
    (activity,) = turn.of_type("sandbox-activity")
    assert activity.kind == "command" and "tool-ran" in activity.description
    conversation = turn.model_requests()[-1].conversation
    assert conversation is not None and conversation.tool_results()
    assert turn.complete.text.startswith(TOOL_FINAL_PREFIX)


def test_tool_turn_runs_the_command_in_dangerous_posture(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[scenario:tool] run it", model=MODEL, posture="dangerous")
    )
    assert_shell_tool_ran(turn)


def test_strict_posture_offers_no_shell_tool(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[scenario:tool] run it", model=MODEL, posture="strict")
    )
    assert turn.complete.text == TEXT_ANSWER
    assert all(SHELL not in r.tool_names() for r in turn.model_requests())


def test_allow_pattern_offers_and_runs_the_shell_tool_under_strict_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(
        HARNESS,
        TurnRequest(
            input="[scenario:tool] run it", model=MODEL, posture="strict", allow=(f"{SHELL}(echo)",)
        ),
    )
    assert SHELL in turn.model_requests()[0].tool_names()
    assert_shell_tool_ran(turn)


def test_deny_pattern_removes_the_shell_tool_even_in_dangerous_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(
        HARNESS,
        TurnRequest(
            input="[scenario:tool] run it", model=MODEL, posture="dangerous", deny=(SHELL,)
        ),
    )
    assert TOOL_OUTPUT not in turn.complete.text
    assert all(SHELL not in r.tool_names() for r in turn.model_requests())


def test_second_turn_resumes_the_session_with_prior_context(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, TurnRequest(input="remember the word PELICAN", model=MODEL))
    session_id = first.complete.session_id
    second = run_live_turn(
        HARNESS,
        TurnRequest(input="what was the word?", turn=2, model=MODEL, resume_session=session_id),
        placement=first.placement,
    )
    assert second.complete.session_id == session_id
    assert second.of_type("session")[0].resumed is True
    call = second.model_requests()[-1]
    assert any("PELICAN" in text for text in call.user_texts())
    assert TEXT_ANSWER in call.assistant_texts()


def test_stale_session_is_rejected_for_a_fresh_retry(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="hi", model=MODEL, resume_session=STALE_SESSION[HARNESS])
    )
    assert turn.error.reason == "harness-error"
    assert turn.state.resume_rejected is True
    assert turn.model_requests() == []


def test_system_prompt_lands_in_system_instruction_not_the_user_message(
    run_live_turn: RunLiveTurn,
) -> None:
    marker = "SYSTEM-MARKER-7f3a: answer in French."
    turn = run_live_turn(
        HARNESS, TurnRequest(input="hi", model=MODEL, system_prompt=marker, posture="dangerous")
    )
    turn.complete  # noqa: B018
    call = turn.model_requests()[-1]
    assert marker in call.system_text()
    assert SHELL in call.system_text()  # the ${AvailableTools} list survived the replacement
    assert all(marker not in text for text in call.user_texts())


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    # 0.61.0 echoes the input as its first stream line and exits without draining stdout: an
    # instant answer can cut a 1 MiB echo short, so this model takes a few seconds.
    text = "-p --help [scenario:slow] [delay:1] " + "x" * (1024 * 1024)
    turn = run_live_turn(HARNESS, TurnRequest(input=text, model=MODEL))
    turn.complete  # noqa: B018
    call = turn.model_requests()[-1]
    assert any(t.startswith("-p --help [") and len(t) >= len(text) for t in call.user_texts())


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
    turn = run_live_turn(
        HARNESS, TurnRequest(input=f"[scenario:{scenario}] hi", model=MODEL), timeout=240
    )
    error = turn.error
    assert (error.reason, error.retryable) == (reason, retryable), turn.describe()


def test_turn_stopped_mid_stream_leaves_a_resumable_session(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, TurnRequest(input="remember the word HERON", model=MODEL))
    session_id = first.complete.session_id
    stopped = run_live_turn(
        HARNESS,
        TurnRequest(
            input="[scenario:slow] [delay:5] go on", turn=2, model=MODEL, resume_session=session_id
        ),
        placement=first.placement,
        timeout=10,
    )
    assert stopped.timed_out and stopped.error.reason == "timeout"
    third = run_live_turn(
        HARNESS,
        TurnRequest(input="and now?", turn=3, model=MODEL, resume_session=session_id),
        placement=first.placement,
    )
    assert third.of_type("session")[0].resumed is True
    assert any("HERON" in t for t in third.model_requests()[-1].user_texts())
