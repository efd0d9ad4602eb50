"""opencode adapter against the real opencode CLI (1.18.33) and the fake model server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.base import Placement
from tests.conformance.conftest import ApiError, RunLiveTurn
from tests.conformance.shared_scenarios import (
    LiveHarness,
    answered_text_turn,
    api_error_turn,
    assert_one_command_ran,
    large_input_call,
)
from tests.fakemodel import TOOL_OUTPUT, USAGE, FakeModelServer

HARNESS = "opencode"
MODEL = "fake-model"
LIVE = LiveHarness(HARNESS, model=MODEL, titles_new_sessions=True, stale_session_exit_code=1)
TOOL = "[scenario:tool] run it"
ask = LIVE.ask


def test_text_turn_reports_answer_usage_and_no_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, ask("[answer-model:other-model-9] hi"))
    done, session, usage = answered_text_turn(turn)
    assert done.exit_code == 0 and session.model is None
    assert done.session_id is not None and done.session_id.startswith("ses_")
    # opencode 1.18.33 names no model in its stream, whatever the API says answered.
    assert done.model is None and turn.state.model is None
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
    assert_one_command_ran(turn)
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
    for call in LIVE.agent_calls(turn):
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
    calls = LIVE.agent_calls(turn)
    assert calls and all("bash" not in call.tool_names() for call in calls)
    # Project config is off, yet the workspace AGENTS.md still reaches the model.
    assert "AGENTS-MARKER-41c2" in calls[0].system_text()


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = '-p --help "quoted words" ' + "x" * (1024 * 1024)
    assert text in large_input_call(run_live_turn, LIVE, text).user_texts()


def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn, api_error: ApiError
) -> None:
    # opencode retries 429 and 5xx itself for up to about 70 s before it gives up.
    turn = api_error_turn(run_live_turn, LIVE, api_error, timeout=150)
    assert turn.error.retry_after_s == api_error.retry_after_s
    assert turn.exit_code == 1 and len(turn.of_type("session")) == 1
