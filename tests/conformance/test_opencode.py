"""opencode adapter against the real opencode CLI (1.18.33) and the fake model server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.protocol import TurnRequest
from sandbox.base import Placement
from tests.conformance.conftest import LiveTurn, RunLiveTurn
from tests.fakemodel import RETRY_AFTER_S, TEXT_ANSWER, TOOL_OUTPUT, USAGE, FakeModelServer
from tests.fakemodel.clis import STALE_SESSION
from tests.fakemodel.server import RecordedRequest

HARNESS = "opencode"
MODEL = "fake-model"
TOOL = "[scenario:tool] run it"


def ask(text: str, **fields: Any) -> TurnRequest:
    return TurnRequest(input=text, model=MODEL, **fields)


def agent_calls(turn: LiveTurn) -> list[RecordedRequest]:
    """The model calls of the agent loop, without opencode's side call that titles a new
    session (no tools, its own system prompt)."""
    return [
        r
        for r in turn.model_requests()
        if not any(t.startswith("Generate a title") for t in r.user_texts())
    ]


def test_text_turn_reports_answer_usage_and_no_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask("[answer-model:other-model-9] hi"))
    done = turn.complete
    assert done.text == TEXT_ANSWER and done.exit_code == 0
    (session,) = turn.of_type("session")
    assert (session.session_id, session.resumed, session.model) == (done.session_id, False, None)
    assert done.session_id is not None and done.session_id.startswith("ses_")
    # opencode 1.18.33 names no model in its stream, whatever the API says answered.
    assert done.model is None and turn.state.model is None
    (usage,) = turn.of_type("usage")
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (
        USAGE.input_tokens, USAGE.cached_input_tokens, USAGE.output_tokens)  # fmt: skip
    assert usage.cost_usd is None and done.cost_usd is None  # our model entry has no price


def test_requested_model_and_base_url_reach_the_server(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer
) -> None:
    turn = run_live_turn(HARNESS, ask("hi"))
    turn.complete  # noqa: B018 -- raises with the details when the turn failed
    calls = turn.model_requests()
    assert calls and all(r.api == "chat" and r.path == "/v1/chat/completions" for r in calls)
    assert {r.requested_model for r in calls} == {MODEL}
    assert all(r.headers.get("authorization") == "<redacted>" for r in calls)
    config = json.loads(turn.command.files[f"{turn.placement.home}/.config/opencode/opencode.json"])
    assert config["provider"]["harness"]["options"]["baseURL"] == fake_model.url + "/v1"


def test_tool_turn_runs_the_command_and_answers_with_its_output(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture="dangerous"))
    assert turn.complete.text.endswith(TOOL_OUTPUT)
    (activity,) = turn.of_type("sandbox-activity")
    assert activity.kind == "command" and "tool-ran" in activity.description
    assert len(turn.of_type("usage")) == 2  # one per model step
    assert turn.complete.input_tokens == 2 * USAGE.input_tokens


@pytest.mark.parametrize(
    ("posture", "offered", "withheld"),
    [("strict", {"read"}, {"bash", "edit", "write"}), ("auto", {"edit", "write"}, {"bash"})],
)
def test_posture_withholds_tools_and_the_command_never_runs(
    run_live_turn: RunLiveTurn, posture: str, offered: set[str], withheld: set[str]
) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture=posture))
    assert TOOL_OUTPUT not in turn.complete.text
    for call in agent_calls(turn):
        assert offered <= set(call.tool_names()) and not withheld & set(call.tool_names())
    assert [a for a in turn.of_type("sandbox-activity") if a.kind == "command"] == []


def test_allow_pattern_lets_a_matching_command_run_under_auto(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture="auto", allow=("Bash(echo:*)",)))
    assert turn.complete.text.endswith(TOOL_OUTPUT)


def test_deny_pattern_fails_the_command_even_in_dangerous_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, ask(TOOL, posture="dangerous", deny=("Bash(echo *)",)))
    assert TOOL_OUTPUT not in turn.complete.text
    (activity,) = turn.of_type("sandbox-activity")
    assert activity.kind == "command" and "(failed: " in activity.description


def test_workspace_config_cannot_loosen_the_posture(
    run_live_turn: RunLiveTurn, live_placement: Callable[[], Placement]
) -> None:
    placement = live_placement()
    workspace = Path(placement.workspace)
    (workspace / "opencode.json").write_text(json.dumps({"permission": {"bash": "allow"}}))
    (workspace / "AGENTS.md").write_text("AGENTS-MARKER-41c2: the workspace instructions.")
    turn = run_live_turn(HARNESS, ask(TOOL, posture="auto"), placement=placement)
    assert TOOL_OUTPUT not in turn.complete.text
    calls = agent_calls(turn)
    assert calls and all("bash" not in call.tool_names() for call in calls)
    # Project config is off, yet the workspace AGENTS.md still reaches the model.
    assert "AGENTS-MARKER-41c2" in calls[0].system_text()


def test_second_turn_resumes_the_session_with_prior_context(run_live_turn: RunLiveTurn) -> None:
    first = run_live_turn(HARNESS, ask("remember the word PELICAN"))
    session_id = first.complete.session_id
    second = run_live_turn(
        HARNESS, ask("what was the word?", turn=2, resume_session=session_id),
        placement=first.placement)  # fmt: skip
    assert second.complete.session_id == session_id
    (session,) = second.of_type("session")
    assert session.resumed is True and second.state.resume_rejected is False
    (call,) = agent_calls(second)
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
    (call,) = agent_calls(turn)
    assert marker in call.system_text()
    assert all(marker not in text for text in call.user_texts())


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = '-p --help "quoted words" ' + "x" * (1024 * 1024)
    turn = run_live_turn(HARNESS, ask(text))
    turn.complete  # noqa: B018
    (call,) = agent_calls(turn)
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
    # opencode retries 429 and 5xx itself for up to about 70 s before it gives up.
    turn = run_live_turn(HARNESS, ask(f"[scenario:{scenario}] hi"), timeout=150)
    error = turn.error
    assert (error.reason, error.retryable) == (reason, retryable), turn.describe()
    assert error.retry_after_s == retry_after
    assert turn.exit_code == 1 and len(turn.of_type("session")) == 1


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
    assert any("HERON" in t for t in agent_calls(third)[-1].user_texts())
