"""claude-code adapter against the real Claude Code CLI and the fake model server."""

from __future__ import annotations

from adapters.protocol import TurnRequest
from tests.conformance.conftest import ApiError, RunLiveTurn
from tests.conformance.shared_scenarios import (
    LiveHarness,
    answered_text_turn,
    api_error_turn,
    assert_one_command_ran,
    large_input_call,
)
from tests.fakemodel import TOOL_OUTPUT, FakeModelServer
from tests.fakemodel.clis import FAKE_KEY

HARNESS = "claude-code"
MODEL = "claude-sonnet-4-5"
#: The shared scenarios name no model: the CLI's default.
LIVE = LiveHarness(HARNESS)
#: The CLI retries 429/5xx ten times over minutes; tests of the error path ask for none.
NO_RETRIES = {"ANTHROPIC_API_KEY": FAKE_KEY, "CLAUDE_CODE_MAX_RETRIES": "0"}


def test_text_turn_reports_answer_usage_cost_and_answering_model(
    run_live_turn: RunLiveTurn,
) -> None:
    turn = run_live_turn(
        HARNESS, TurnRequest(input="[answer-model:claude-other-9] hi", model=MODEL)
    )
    done, session, usage = answered_text_turn(turn)
    # Requested one model, the API said another answered: the stream's message.model wins.
    assert {r.requested_model for r in turn.model_requests()} == {MODEL}
    assert done.model == session.model == "claude-other-9"
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
    assert_one_command_ran(turn)


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


def test_large_input_starting_with_a_dash_arrives_whole(run_live_turn: RunLiveTurn) -> None:
    text = "-p --help " + "x" * (1024 * 1024)
    call = large_input_call(run_live_turn, LIVE, text)
    assert any(t.startswith("-p --help xxx") and len(t) >= len(text) for t in call.user_texts())


def test_api_errors_end_the_turn_classified(
    run_live_turn: RunLiveTurn, api_error: ApiError
) -> None:
    turn = api_error_turn(run_live_turn, LIVE, api_error, secrets=NO_RETRIES, timeout=90)
    if api_error.scenario == "http-429" and turn.error.retry_after_s is not None:
        assert turn.error.retry_after_s == api_error.retry_after_s


def test_auth_failure_ends_the_turn_at_the_first_retry_notice(run_live_turn: RunLiveTurn) -> None:
    turn = run_live_turn(HARNESS, "[scenario:http-401] hi", timeout=60)
    assert turn.error.reason == "auth"
    assert turn.duration_s < 30  # the CLI alone would retry for minutes
