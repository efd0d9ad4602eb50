"""pi adapter against the real pi coding agent (0.73.1) and the fake model server."""

from __future__ import annotations

import json

import pytest

from tests.conformance.conftest import ApiError, RunLiveTurn
from tests.conformance.shared_scenarios import (
    LiveHarness,
    answered_text_turn,
    api_error_turn,
    assert_one_command_ran,
    large_input_call,
)
from tests.fakemodel import TEXT_ANSWER, TOOL_OUTPUT, USAGE, FakeModelServer

HARNESS = "pi"
MODEL = "fake-model"
LIVE = LiveHarness(HARNESS, model=MODEL, stale_session_exit_code=1)
TOOL = "[scenario:tool] run it"
ask = LIVE.ask


def test_text_turn_reports_answer_and_usage_but_no_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask("hi"))
    done, session, usage = answered_text_turn(turn)
    assert session.model is None and done.model is None  # model_reporting is false
    assert usage.cost_usd is None and done.cost_usd is None  # our model entry has no price


def test_the_model_pi_names_is_the_one_requested_so_none_is_reported(
    run_live_turn: RunLiveTurn,
) -> None:
    # pi 0.73.1 names the model it addressed in every assistant message and ignores the
    # model field of the API's reply: an echo of our request, which is why its
    # model_reporting is false and the turn reports no model (docs/events.md: null).
    turn = run_live_turn(HARNESS, ask("[answer-model:other-model-9] hi"))
    assert {r.answered_model for r in turn.model_requests()} == {"other-model-9"}
    assert turn.state.model == MODEL
    assert turn.complete.model is None and turn.of_type("session")[0].model is None  # type: ignore[union-attr]


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
    assert_one_command_ran(turn)
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


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = '-p --help @file "quoted words" ' + "x" * (1024 * 1024)
    assert text in large_input_call(run_live_turn, LIVE, text).user_texts()


def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn, api_error: ApiError
) -> None:
    # pi exits 0 with the error only in the stream, after its own retries (up to ~70 s).
    turn = api_error_turn(run_live_turn, LIVE, api_error, timeout=150)
    assert turn.error.retry_after_s == api_error.retry_after_s
    assert turn.exit_code == 0 and len(turn.of_type("session")) == 1
