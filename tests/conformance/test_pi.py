"""pi adapter against the real pi coding agent (0.73.1) and the fake model server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.protocol import TurnRequest
from tests.conformance.conftest import RunLiveTurn
from tests.fakemodel import RETRY_AFTER_S, TEXT_ANSWER, TOOL_OUTPUT, USAGE, FakeModelServer
from tests.fakemodel.clis import STALE_SESSION

HARNESS = "pi"
MODEL = "fake-model"
TOOL = "[scenario:tool] run it"


def ask(text: str, **fields: Any) -> TurnRequest:
    return TurnRequest(input=text, model=MODEL, **fields)


def test_text_turn_reports_answer_usage_and_the_model_pi_names(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, ask("hi"))
    done = turn.complete
    assert done.text == TEXT_ANSWER
    (session,) = turn.of_type("session")
    assert (session.session_id, session.resumed) == (done.session_id, False)
    assert session.model == done.model == turn.state.model == MODEL
    (usage,) = turn.of_type("usage")
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (
        USAGE.input_tokens, USAGE.cached_input_tokens, USAGE.output_tokens)  # fmt: skip
    assert usage.cost_usd is None and done.cost_usd is None  # our model entry has no price


def test_reported_model_is_what_pi_says_not_what_the_server_claims(
    run_live_turn: RunLiveTurn,
) -> None:
    # pi 0.73.1 names the model it addressed in every assistant message; it ignores the
    # model field of the API's reply, so that is what the turn reports.
    turn = run_live_turn(HARNESS, ask("[answer-model:other-model-9] hi"))
    assert {r.answered_model for r in turn.model_requests()} == {"other-model-9"}
    assert turn.complete.model == MODEL


def test_requested_model_and_base_url_reach_the_server(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer
) -> None:
    turn = run_live_turn(HARNESS, ask("hi"))
    turn.complete  # noqa: B018 -- raises with the details when the turn failed
    (call,) = turn.model_requests()
    assert (call.api, call.path, call.requested_model) == ("chat", "/v1/chat/completions", MODEL)
    assert call.headers.get("authorization") == "<redacted>"
    models = json.loads(turn.command.files[f"{turn.placement.home}/.pi/agent/models.json"])
    assert models["providers"]["harness"]["baseUrl"] == fake_model.url + "/v1"


def test_tool_turn_runs_the_command_and_answers_with_its_output(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture="dangerous"))
    assert turn.complete.text.endswith(TOOL_OUTPUT)
    (activity,) = turn.of_type("sandbox-activity")
    assert activity.kind == "command" and "tool-ran" in activity.description
    assert len(turn.of_type("usage")) == 2  # one per assistant message
    assert turn.complete.input_tokens == 2 * USAGE.input_tokens


@pytest.mark.parametrize(
    ("posture", "tools"),
    [
        ("strict", {"read", "grep", "find", "ls"}),
        ("auto", {"read", "grep", "find", "ls", "edit", "write"}),
    ],
)
def test_posture_is_the_tool_allowlist_and_the_command_never_runs(
    run_live_turn: RunLiveTurn, posture: str, tools: set[str]
) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture=posture))
    assert turn.complete.text == TEXT_ANSWER  # no shell tool offered: the model just answers
    assert {frozenset(call.tool_names()) for call in turn.model_requests()} == {frozenset(tools)}
    assert turn.of_type("sandbox-activity") == []


def test_allow_pattern_adds_a_whole_tool(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture="strict", allow=("Bash",)))
    assert turn.complete.text.endswith(TOOL_OUTPUT)


def test_command_scoped_deny_removes_the_whole_tool_in_dangerous_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture="dangerous", deny=("Bash(echo *)",)))
    assert TOOL_OUTPUT not in turn.complete.text
    assert all("bash" not in call.tool_names() for call in turn.model_requests())


def test_second_turn_resumes_the_session_with_prior_context(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, ask("remember the word PELICAN"))
    session_id = first.complete.session_id
    second = run_live_turn(
        HARNESS, ask("what was the word?", turn=2, resume_session=session_id),
        placement=first.placement)  # fmt: skip
    assert second.complete.session_id == session_id
    (session,) = second.of_type("session")
    assert session.resumed is True and second.state.resume_rejected is False
    (call,) = second.model_requests()
    assert any("PELICAN" in text for text in call.user_texts())
    assert TEXT_ANSWER in call.assistant_texts()


def test_stale_session_is_rejected_for_a_fresh_retry(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask("hi", resume_session=STALE_SESSION[HARNESS]))
    assert turn.error.reason == "harness-error" and turn.error.exit_code == 1
    assert turn.state.resume_rejected is True
    assert turn.of_type("session") == []
    assert turn.model_requests() == []


def test_system_prompt_lands_in_the_system_message_not_the_user_message(
    run_live_turn: RunLiveTurn,
) -> None:
    marker = 'SYSTEM-MARKER-7f3a: "quoted" \\ and\nnewline'
    turn = run_live_turn(HARNESS, ask("hi", system_prompt=marker))
    turn.complete  # noqa: B018
    (call,) = turn.model_requests()
    assert marker in call.system_text()
    assert all(marker not in text for text in call.user_texts())


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = '-p --help @file "quoted words" ' + "x" * (1024 * 1024)
    turn = run_live_turn(HARNESS, ask(text))
    turn.complete  # noqa: B018
    (call,) = turn.model_requests()
    assert text in call.user_texts()


@pytest.mark.parametrize(
    ("scenario", "reason", "retryable", "retry_after"),
    [
        ("http-429", "rate-limited", True, RETRY_AFTER_S),
        ("http-401", "auth", False, None),
        ("quota", "quota", False, None),
        ("http-500", "harness-error", True, None),
    ],
)
def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn,
    scenario: str,
    reason: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    # pi exits 0 with the error only in the stream, after its own retries (up to ~70 s).
    turn = run_live_turn(HARNESS, ask(f"[scenario:{scenario}] hi"), timeout=150)
    error = turn.error
    assert (error.reason, error.retryable) == (reason, retryable), turn.describe()
    assert error.retry_after_s == retry_after
    assert turn.exit_code == 0 and len(turn.of_type("session")) == 1


def test_dropped_connection_ends_the_turn_with_one_terminal(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask("[scenario:truncated] hi"), timeout=150)
    assert turn.terminal is not None and turn.events[-1] is turn.terminal
    assert sum(1 for e in turn.events if e.terminal) == 1


def test_turn_stopped_mid_stream_leaves_a_resumable_session(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, ask("remember the word HERON"))
    session_id = first.complete.session_id
    stopped = run_live_turn(
        HARNESS, ask("[scenario:slow] [delay:5] go on", turn=2, resume_session=session_id),
        placement=first.placement, timeout=8)  # fmt: skip
    assert stopped.timed_out and stopped.error.reason == "timeout"
    third = run_live_turn(
        HARNESS, ask("and now?", turn=3, resume_session=session_id), placement=first.placement
    )
    assert third.of_type("session")[0].resumed is True
    assert any("HERON" in t for t in third.model_requests()[-1].user_texts())
