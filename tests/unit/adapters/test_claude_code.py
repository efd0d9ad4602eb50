"""claude-code adapter: recorded real output of Claude Code 2.1.328, and its command line."""

from __future__ import annotations

import json

import pytest
from helpers import (
    MIB,
    RecordedHarness,
    assert_input_rides_on_stdin,
    by_type,
    json_lines,
    offered_session_fields,
    replay,
)

from adapters import claude_code as adapter
from adapters.events import PermissionRequest, SandboxActivity, SessionError, TurnComplete
from adapters.protocol import ExitInfo, TurnRequest

HARNESS = adapter.HARNESS_ID
SESSION = "ac5deac9-626f-40eb-9594-3a79911158ce"
RECORDED = RecordedHarness(adapter, request_fields=offered_session_fields, session=SESSION)
request_for = RECORDED.request_for
run = RECORDED.run


# --- recorded streams (what every harness must do is in test_every_adapter.py) -----------


def test_tool_turn_reports_command_answer_usage_and_cost() -> None:
    events, _ = run("ref-tool")
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="command", description="echo tool-ok")
    ]
    (session,) = by_type(events, "session")
    assert (session.session_id, session.resumed, session.model) == (
        SESSION,
        False,
        "claude-opus-5-5",
    )
    (usage,) = by_type(events, "usage")
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (642, 90, 0.004368)
    terminal = events[-1]
    assert isinstance(terminal, TurnComplete)
    assert terminal.text == "Tool finished; final answer ✓"
    assert (terminal.session_id, terminal.model, terminal.cost_usd) == (
        SESSION,
        "claude-opus-5-5",
        0.004368,
    )


def test_resumed_turn_reports_resumed_when_session_id_matches_offer() -> None:
    events, driver = run("ref-resume")
    (session,) = by_type(events, "session")
    assert session.resumed is True
    assert driver.state.resume_rejected is False
    # result.usage is this invocation; result.modelUsage (963) is the whole conversation.
    assert events[-1].input_tokens == 321


def test_stale_session_sets_resume_rejected_and_ends_with_session_error() -> None:
    events, driver = run("ref-badresume")
    assert driver.state.resume_rejected is True
    assert driver.state.session_id is None
    assert by_type(events, "session") == []
    assert isinstance(events[-1], SessionError)
    assert "No conversation found" in events[-1].error


def test_auth_retry_line_ends_turn_as_auth_without_waiting_for_retries() -> None:
    events, driver = run("ref-401")
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert (terminal.reason, terminal.retryable) == ("auth", False)
    # The first api_retry line ended it; the other eight are dropped after the terminal.
    assert driver.counters.dropped_after_terminal == 8


def test_api_error_result_with_success_subtype_is_an_error() -> None:
    events, _ = run("connection-refused")
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert "Connection refused" in terminal.error
    assert by_type(events, "assistant-text") == []  # the synthetic message is not an answer
    assert by_type(events, "turn-complete") == []


@pytest.mark.parametrize(
    ("status", "text", "reason", "retryable"),
    [
        (429, "API Error: 429 rate_limit_error", "rate-limited", True),
        (529, "API Error: 529 Overloaded", "rate-limited", True),
        (401, "Failed to authenticate. API Error: 401", "auth", False),
        (400, "Your credit balance is too low to access the Anthropic API", "quota", False),
        (500, "API Error: 500 Internal server error", "harness-error", True),
    ],
)
def test_error_result_is_classified_by_status_and_text(
    status: int, text: str, reason: str, retryable: bool
) -> None:
    line = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "result": text,
        "api_error_status": status,
        "session_id": SESSION,
        "usage": {},
    }
    events, _ = replay(adapter, TurnRequest(input="q"), json_lines(line), ExitInfo(exit_code=1))
    assert (events[-1].reason, events[-1].retryable) == (reason, retryable)


def test_rate_limit_error_carries_cli_retry_delay_when_api_gives_none() -> None:
    lines = [
        {
            "type": "system",
            "subtype": "api_retry",
            "attempt": 1,
            "max_retries": 10,
            "retry_delay_ms": 2500,
            "error_status": 429,
            "error": "rate_limit",
        },
        {"type": "result", "is_error": True, "result": "API Error: 429", "api_error_status": 429},
    ]
    events, _ = replay(
        adapter,
        TurnRequest(input="q"),
        json_lines(*lines),
        ExitInfo(exit_code=1),
    )
    assert (events[-1].reason, events[-1].retry_after_s) == ("rate-limited", 2.5)


def test_permission_denied_line_and_result_denials_become_one_permission_request() -> None:
    lines = [
        {"type": "system", "subtype": "init", "session_id": SESSION, "model": "m"},
        {
            "type": "assistant",
            "message": {
                "model": "m",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "touch file"},
                    }
                ],
            },
        },
        {
            "type": "system",
            "subtype": "permission_denied",
            "tool_name": "Bash",
            "tool_use_id": "toolu_1",
            "message": "touch in '/w' needs approval",
        },
        {
            "type": "result",
            "is_error": False,
            "result": "I could not.",
            "session_id": SESSION,
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "permission_denials": [
                {
                    "tool_name": "Bash",
                    "tool_use_id": "toolu_1",
                    "tool_input": {"command": "touch file"},
                },
                {
                    "tool_name": "Write",
                    "tool_use_id": "toolu_2",
                    "tool_input": {"file_path": "/w/x"},
                },
            ],
        },
    ]
    events, _ = replay(
        adapter,
        TurnRequest(input="q"),
        json_lines(*lines),
        ExitInfo(exit_code=0),
    )
    assert by_type(events, "permission-request") == [
        PermissionRequest(
            request_id="toolu_1", description="touch in '/w' needs approval", command="touch file"
        ),
        PermissionRequest(
            request_id="toolu_2",
            description="Write was denied by the permission policy",
            command=None,
        ),
    ]
    assert isinstance(events[-1], TurnComplete)


def test_result_denial_without_earlier_tool_line_takes_command_from_tool_input() -> None:
    line = {
        "type": "result",
        "is_error": False,
        "result": "no",
        "usage": {"output_tokens": 1},
        "permission_denials": [
            {"tool_name": "Bash", "tool_use_id": "t9", "tool_input": {"command": "rm -rf build"}}
        ],
    }
    events, _ = replay(adapter, TurnRequest(input="q"), json_lines(line), ExitInfo(exit_code=0))
    (request,) = by_type(events, "permission-request")
    assert (request.request_id, request.command) == ("t9", "rm -rf build")


def test_edit_tool_is_file_activity_and_other_tools_are_tool_activity() -> None:
    line = {
        "type": "assistant",
        "message": {
            "model": "m",
            "content": [
                {"type": "tool_use", "id": "a", "name": "Edit", "input": {"file_path": "/w/x.py"}},
                {"type": "tool_use", "id": "b", "name": "WebFetch", "input": {"url": "u"}},
                {"type": "text", "text": "done"},
            ],
        },
    }
    events, _ = replay(adapter, TurnRequest(input="q"), json_lines(line), ExitInfo(exit_code=0))
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="file", description="Edit /w/x.py"),
        SandboxActivity(kind="tool", description="WebFetch"),
    ]


def test_exit_without_result_after_api_error_message_is_classified_from_it() -> None:
    line = {
        "type": "assistant",
        "is_api_error_message": True,
        "message": {
            "model": "<synthetic>",
            "content": [{"type": "text", "text": "API Error: 529 overloaded"}],
        },
    }
    events, _ = replay(adapter, TurnRequest(input="q"), json_lines(line), ExitInfo(exit_code=1))
    assert (events[-1].reason, events[-1].exit_code) == ("rate-limited", 1)


# --- the command line --------------------------------------------------------------------


def test_first_turn_reads_prompt_from_stdin_in_stream_json_mode() -> None:
    command = adapter.build_command(TurnRequest(input="hello", workspace="/w", home="/w/.home"))
    assert command.argv[:5] == ("claude", "-p", "--output-format", "stream-json", "--verbose")
    assert "--resume" not in command.argv
    assert command.stdin == b"hello"
    assert command.cwd == "/w"


def test_resumed_turn_passes_the_session_id() -> None:
    command = adapter.build_command(TurnRequest(input="q", resume_session=SESSION))
    index = command.argv.index("--resume")
    assert command.argv[index + 1] == SESSION


def test_requested_model_is_passed_with_model_flag() -> None:
    command = adapter.build_command(TurnRequest(input="q", model="claude-sonnet-4-5"))
    assert command.argv[command.argv.index("--model") + 1] == "claude-sonnet-4-5"


def test_system_prompt_is_appended_from_a_file_under_home() -> None:
    command = adapter.build_command(TurnRequest(input="q", home="/h", system_prompt="Be terse."))
    path = command.argv[command.argv.index("--append-system-prompt-file") + 1]
    assert path.startswith("/h/")
    assert command.files[path] == "Be terse."
    assert b"Be terse." not in command.stdin  # type: ignore[operator]


def test_base_url_goes_to_anthropic_base_url() -> None:
    command = adapter.build_command(TurnRequest(input="q", base_url="http://127.0.0.1:9"))
    assert command.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("posture", "flags"),
    [
        ("strict", ["--permission-mode", "dontAsk"]),
        ("auto", ["--permission-mode", "acceptEdits"]),
        ("dangerous", ["--dangerously-skip-permissions"]),
    ],
)
def test_posture_maps_to_permission_flags(posture: str, flags: list[str]) -> None:
    argv = adapter.build_command(TurnRequest(input="q", posture=posture)).argv  # type: ignore[arg-type]
    start = argv.index(flags[0])
    assert list(argv[start : start + len(flags)]) == flags
    assert ("--dangerously-skip-permissions" in argv) == (posture == "dangerous")


def test_allow_and_deny_patterns_become_one_argv_element_each() -> None:
    argv = adapter.build_command(
        TurnRequest(input="q", allow=("Bash(git *)", "Edit"), deny=("Bash(rm *)",))
    ).argv
    i = argv.index("--allowedTools")
    assert argv[i + 1 : i + 3] == ("Bash(git *)", "Edit")
    assert argv[argv.index("--disallowedTools") + 1] == "Bash(rm *)"


@pytest.mark.parametrize("text", ["-rf /", "--help", "x" * MIB])
def test_input_never_rides_in_argv(text: str) -> None:
    assert_input_rides_on_stdin(
        adapter.build_command(TurnRequest(input=text, allow=("Read",))), text
    )


def test_granted_secrets_are_never_set_by_the_adapter() -> None:
    granted = frozenset({"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"})
    command = adapter.build_command(
        TurnRequest(input="q", granted_env=granted, base_url="http://x", system_prompt="s")
    )
    assert not granted & set(command.env)
    blob = json.dumps([command.argv, dict(command.env), dict(command.files)])
    assert "ANTHROPIC_API_KEY" not in blob


def test_policy_warning_is_none_for_enforced_postures() -> None:
    assert adapter.policy_warning(TurnRequest(input="q", posture="strict", allow=("Read",))) is None


def test_a_result_whose_lists_are_not_lists_reads_them_as_empty() -> None:
    # Found by the mutation test: `"errors": true` used to raise inside the mapper.
    state = adapter.new_state(TurnRequest(input="q"))
    message = {"type": "result", "is_error": True, "errors": True, "permission_denials": "x"}
    [error] = adapter.map_message({**message, "result": "boom"}, state)
    assert (error.type, error.error) == ("session-error", "boom")
