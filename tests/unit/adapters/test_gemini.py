"""gemini adapter: recorded real output of gemini-cli 0.61.0, and its command line."""

from __future__ import annotations

import json
import tomllib

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

from adapters import gemini as adapter
from adapters.events import SandboxActivity, SessionError, TurnComplete
from adapters.protocol import ExitInfo, TurnRequest

HARNESS = adapter.HARNESS_ID
SESSION = "dc8f7ac7-485e-480c-a3df-f49d1a596ae1"
RECORDED = RecordedHarness(adapter, request_fields=offered_session_fields, session=SESSION)
request_for = RECORDED.request_for
run = RECORDED.run


# --- recorded streams (what every harness must do is in test_every_adapter.py) -----------


def test_text_turn_reports_answer_usage_and_model_that_answered() -> None:
    events, _ = run("ref-text")
    (session,) = by_type(events, "session")
    # init said gemini-2.5-flash (requested); stats.models names the one that answered.
    assert (session.model, session.resumed) == ("gemini-fake", False)
    terminal = events[-1]
    assert isinstance(terminal, TurnComplete)
    assert (terminal.text, terminal.model) == ("Hello from the fake model.", "gemini-fake")
    assert (terminal.input_tokens, terminal.output_tokens, terminal.cost_usd) == (12, 7, None)


def test_tool_turn_reports_command_and_answer_after_the_tool() -> None:
    events, _ = run("ref-tool")
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="command", description="echo tool-ok")
    ]
    assert events[-1].text == "Tool finished; final answer ✓"


def test_final_answer_is_the_text_after_the_last_tool_call() -> None:
    lines = [
        {"type": "init", "session_id": "s", "model": "m"},
        {"type": "message", "role": "assistant", "content": "Let me look.", "delta": True},
        {
            "type": "tool_use",
            "tool_name": "write_file",
            "tool_id": "t",
            "parameters": {"file_path": "/w/a.txt", "content": "x"},
        },
        {"type": "tool_result", "tool_id": "t", "status": "success", "output": "ok"},
        {"type": "message", "role": "assistant", "content": "Wrote ", "delta": True},
        {"type": "message", "role": "assistant", "content": "it.", "delta": True},
        {
            "type": "result",
            "status": "success",
            "stats": {"input_tokens": 5, "output_tokens": 2, "models": {"m": {"total_tokens": 7}}},
        },
    ]
    events, _ = replay(adapter, request_for("x"), json_lines(*lines), ExitInfo(exit_code=0))
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="file", description="write_file /w/a.txt")
    ]
    assert events[-1].text == "Wrote it."
    assert [e.text for e in by_type(events, "assistant-text")] == ["Let me look.", "Wrote ", "it."]


def test_model_that_did_the_work_wins_over_the_router_classifier() -> None:
    line = {
        "type": "result",
        "status": "success",
        "stats": {
            "models": {
                "gemini-2.5-flash-lite": {"total_tokens": 40},
                "gemini-2.5-pro": {"total_tokens": 900},
            }
        },
    }
    _, driver = replay(adapter, request_for("x"), json_lines(line), ExitInfo(exit_code=0))
    assert driver.state.model == "gemini-2.5-pro"


def test_auth_error_result_is_classified_as_auth() -> None:
    events, _ = run("ref-401")
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert (terminal.reason, terminal.retryable) == ("auth", False)
    assert "invalid api key" in terminal.error


@pytest.mark.parametrize(
    ("message", "reason", "retry_after"),
    [
        (
            '[API Error: {"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Resource '
            'has been exhausted (e.g. check quota)."}}] Please retry in 7s.',
            "rate-limited",
            7.0,
        ),
        (
            '[API Error: {"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"You '
            'exceeded your current quota, please check your plan and billing details."}}]',
            "quota",
            None,
        ),
        (
            '[API Error: {"error":{"code":500,"status":"INTERNAL","message":"boom"}}]',
            "harness-error",
            None,
        ),
    ],
)
def test_error_result_is_classified(message: str, reason: str, retry_after: float | None) -> None:
    line = {"type": "result", "status": "error", "error": {"type": "unknown", "message": message}}
    events, _ = replay(adapter, request_for("x"), json_lines(line), ExitInfo(exit_code=173))
    assert (events[-1].reason, events[-1].retry_after_s) == (reason, retry_after)


def test_exit_41_without_result_is_an_auth_error() -> None:
    events, _ = replay(adapter, request_for("x"), b"", ExitInfo(41, "Invalid auth method"))
    assert events[-1].reason == "auth"


# --- the command line --------------------------------------------------------------------


def test_first_turn_reads_input_from_stdin_with_empty_prompt_flag() -> None:
    command = adapter.build_command(TurnRequest(input="hello", workspace="/w", home="/h"))
    assert command.argv[:3] == ("gemini", "--output-format", "stream-json")
    assert command.argv[-2:] == ("--prompt", "")
    assert "--resume" not in command.argv
    assert command.stdin == b"hello"
    assert command.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    settings_json = json.loads(command.files["/h/.gemini/settings.json"])
    assert settings_json["security"] == {"auth": {"selectedType": "gemini-api-key"}}
    assert settings_json["general"]["maxAttempts"] == 3


def test_resumed_turn_and_model_are_flags() -> None:
    argv = adapter.build_command(
        TurnRequest(input="q", resume_session=SESSION, model="gemini-2.5-flash")
    ).argv
    assert argv[argv.index("--resume") + 1] == SESSION
    assert argv[argv.index("--model") + 1] == "gemini-2.5-flash"


def test_base_url_goes_to_google_gemini_base_url() -> None:
    command = adapter.build_command(TurnRequest(input="q", base_url="http://127.0.0.1:9"))
    assert command.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9"


def test_system_prompt_replaces_gemini_prompt_through_a_file_keeping_the_tool_list() -> None:
    command = adapter.build_command(TurnRequest(input="q", home="/h", system_prompt="Be terse."))
    path = command.env["GEMINI_SYSTEM_MD"]
    assert path.startswith("/h/")
    assert command.files[path].rstrip().endswith("Be terse.")
    assert "${AvailableTools}" in command.files[path]


@pytest.mark.parametrize(
    ("posture", "mode"), [("strict", "default"), ("auto", "auto_edit"), ("dangerous", "yolo")]
)
def test_posture_maps_to_approval_mode(posture: str, mode: str) -> None:
    argv = adapter.build_command(TurnRequest(input="q", posture=posture)).argv  # type: ignore[arg-type]
    assert argv[argv.index("--approval-mode") + 1] == mode


def test_allow_and_deny_patterns_become_a_policy_file_where_deny_wins() -> None:
    command = adapter.build_command(
        TurnRequest(
            input="q",
            home="/h",
            allow=("run_shell_command(git)", "write_file"),
            deny=("run_shell_command(git push)",),
        )
    )
    (flag,) = [a for a in command.argv if a.startswith("--policy=")]
    rules = tomllib.loads(command.files[flag.removeprefix("--policy=")])["rule"]
    assert rules == [
        {
            "toolName": "run_shell_command",
            "commandPrefix": "git",
            "decision": "allow",
            "priority": 500,
        },
        {"toolName": "write_file", "decision": "allow", "priority": 500},
        {
            "toolName": "run_shell_command",
            "commandPrefix": "git push",
            "decision": "deny",
            "priority": 900,
        },
    ]


def test_malformed_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="NAME"):
        adapter.build_command(TurnRequest(input="q", deny=("two words",)))


@pytest.mark.parametrize("text", ["-rf /", "--help", "x" * MIB])
def test_input_never_rides_in_argv(text: str) -> None:
    assert_input_rides_on_stdin(adapter.build_command(TurnRequest(input=text)), text)


def test_granted_secrets_are_never_set_by_the_adapter() -> None:
    granted = frozenset({"GEMINI_API_KEY", "GOOGLE_API_KEY"})
    command = adapter.build_command(
        TurnRequest(input="q", granted_env=granted, base_url="http://x", system_prompt="s")
    )
    assert not granted & set(command.env)
    assert "GEMINI_API_KEY" not in json.dumps([command.argv, dict(command.files)])
