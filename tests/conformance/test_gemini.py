"""gemini adapter against the real Gemini CLI and the fake model server."""

from __future__ import annotations

from tests.conformance.conftest import ApiError, LiveTurn, RunLiveTurn
from tests.conformance.shared_scenarios import (
    PLAIN_SYSTEM_PROMPT,
    LiveHarness,
    answered_text_turn,
    api_error_turn,
    assert_one_command_ran,
    large_input_call,
    system_prompt_call,
)
from tests.fakemodel import TEXT_ANSWER, TOOL_FINAL_PREFIX, TOOL_OUTPUT, FakeModelServer

HARNESS = "gemini"
MODEL = "gemini-2.5-flash"
SHELL = "run_shell_command"
LIVE = LiveHarness(
    HARNESS,
    model=MODEL,
    # The CLI may call the model more than once for an answer: the answer is the last call.
    one_call_per_answer=False,
    # The CLI takes a few seconds to start before it streams.
    stopped_turn_timeout_s=10.0,
)
TOOL = "[scenario:tool] run it"


def test_text_turn_reports_answer_usage_and_answering_model(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, LIVE.ask("[answer-model:gemini-other-9] hi"))
    done, session, _ = answered_text_turn(turn)
    assert {r.requested_model for r in turn.model_requests()} == {MODEL}
    assert done.model == session.model == "gemini-other-9"
    assert done.cost_usd is None


def test_base_url_sends_model_traffic_to_the_given_endpoint(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer
) -> None:
    turn = run_live_turn(HARNESS, LIVE.ask("hi"))
    turn.complete  # noqa: B018 -- raises with details when the turn failed
    assert turn.command.env["GOOGLE_GEMINI_BASE_URL"] == fake_model.url
    calls = turn.model_requests()
    assert calls and all(r.api == "gemini" for r in calls)


def assert_shell_tool_ran(turn: LiveTurn) -> None:
    # 0.61.0 refuses the fake's `echo tool-ran-$((6*7))` as "command injection" after the
    # policy let it through: the call and its result are what show the posture at work.
    assert_one_command_ran(turn)
    conversation = turn.model_requests()[-1].conversation
    assert conversation is not None and conversation.tool_results()
    assert turn.complete.text.startswith(TOOL_FINAL_PREFIX)


def test_tool_turn_runs_the_command_in_dangerous_posture(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, LIVE.ask(TOOL, posture="dangerous"))
    assert_shell_tool_ran(turn)


def test_strict_posture_offers_no_shell_tool(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, LIVE.ask(TOOL, posture="strict"))
    assert turn.complete.text == TEXT_ANSWER
    assert all(SHELL not in r.tool_names() for r in turn.model_requests())


def test_allow_pattern_offers_and_runs_the_shell_tool_under_strict_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, LIVE.ask(TOOL, posture="strict", allow=(f"{SHELL}(echo)",)))
    assert SHELL in turn.model_requests()[0].tool_names()
    assert_shell_tool_ran(turn)


def test_deny_pattern_removes_the_shell_tool_even_in_dangerous_posture(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(HARNESS, LIVE.ask(TOOL, posture="dangerous", deny=(SHELL,)))
    assert TOOL_OUTPUT not in turn.complete.text
    assert all(SHELL not in r.tool_names() for r in turn.model_requests())


def test_system_prompt_lands_in_system_instruction_not_the_user_message(
    run_live_turn: RunLiveTurn,
) -> None:
    call = system_prompt_call(run_live_turn, LIVE, PLAIN_SYSTEM_PROMPT, posture="dangerous")
    assert SHELL in call.system_text()  # the ${AvailableTools} list survived the replacement


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    # 0.61.0 echoes the input as its first stream line and exits without draining stdout: an
    # instant answer can cut a 1 MiB echo short, so this model takes a few seconds.
    text = "-p --help [scenario:slow] [delay:1] " + "x" * (1024 * 1024)
    call = large_input_call(run_live_turn, LIVE, text)
    assert any(t.startswith("-p --help [") and len(t) >= len(text) for t in call.user_texts())


def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn, api_error: ApiError
) -> None:
    api_error_turn(run_live_turn, LIVE, api_error, timeout=240)
