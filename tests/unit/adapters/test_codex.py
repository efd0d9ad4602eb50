"""codex adapter: recorded real output of codex-cli 0.169.0, and its command line."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
from helpers import (
    MIB,
    RecordedHarness,
    assert_input_rides_on_stdin,
    by_type,
    json_lines,
    meta,
    offered_session_fields,
    replay,
)

from adapters import codex as adapter
from adapters.events import SandboxActivity, SessionError, TurnComplete
from adapters.protocol import ExitInfo, TurnRequest

HARNESS = adapter.HARNESS_ID
THREAD = "01a22a13-bdde-71e0-a584-8dfac2ce7871"
#: What the recorded first turn (tool) left for the recorded second turn (resume).
AFTER_TOOL = {
    "thread_id": THREAD,
    "input_tokens": 642,
    "cached_input_tokens": 0,
    "output_tokens": 90,
}
#: The recorded resume's first turn was the fake server's text scenario: 120 / 20 / 30.
RECORDED_FIRST = {"input_tokens": 120, "cached_input_tokens": 20, "output_tokens": 30}
CARRY = {
    "ref-resume": AFTER_TOOL,
    "resume": {"thread_id": meta(HARNESS, "resume").get("resume_session"), **RECORDED_FIRST},
}
OTHER_THREAD = "01a22a00-0000-7000-8000-000000000000"


def request_fields(harness_id: str, scenario: str) -> dict[str, Any]:
    """As recorded, with what the thread's recorded earlier turn left in ``carry``."""
    return {**offered_session_fields(harness_id, scenario), "carry": CARRY.get(scenario, {})}


RECORDED = RecordedHarness(
    adapter=adapter,
    request_fields=request_fields,
    session=THREAD,
    carries=({}, AFTER_TOOL, {"thread_id": 5, "input_tokens": "x"}),
)
request_for = RECORDED.request_for
run = RECORDED.run


def config(command: Any, home: str = "/workspace/.home") -> dict[str, Any]:
    return tomllib.loads(command.files[f"{home}/.codex/config.toml"])


# --- recorded streams (what every harness must do is in test_every_adapter.py) -----------


def test_tool_turn_reports_thread_command_and_final_answer_without_model() -> None:
    events, driver = run("ref-tool")
    (session,) = by_type(events, "session")
    assert (session.session_id, session.resumed, session.model) == (THREAD, False, None)
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="command", description="/bin/bash -lc 'echo tool-ok'")
    ]
    terminal = events[-1]
    assert isinstance(terminal, TurnComplete)
    assert (terminal.text, terminal.model, terminal.cost_usd) == (
        "Tool finished; final answer ✓",
        None,
        None,
    )
    assert (terminal.input_tokens, terminal.output_tokens) == (642, 90)
    assert driver.state.carry == AFTER_TOOL


def test_model_metadata_warning_item_is_not_an_error_or_text() -> None:
    events, _ = run("ref-tool")
    assert by_type(events, "assistant-text")[0].text == "Tool finished; final answer ✓"
    assert len(by_type(events, "assistant-text")) == 1


def test_resumed_turn_subtracts_what_earlier_turns_of_the_thread_counted() -> None:
    events, driver = run("ref-resume")
    (session,) = by_type(events, "session")
    assert session.resumed is True
    (usage,) = by_type(events, "usage")
    # turn.completed said 963 / 135: the thread's total, 642 / 90 of it from turn one.
    assert (usage.input_tokens, usage.output_tokens) == (321, 45)
    assert (events[-1].input_tokens, events[-1].output_tokens) == (321, 45)
    assert driver.state.carry["input_tokens"] == 963


def test_running_total_is_not_subtracted_when_carry_is_from_another_thread() -> None:
    other = {**AFTER_TOOL, "thread_id": OTHER_THREAD}
    events, _ = run("ref-resume", carry=other)
    assert by_type(events, "usage")[0].input_tokens == 963


def test_resumed_is_false_when_cli_starts_another_thread() -> None:
    events, _ = run("ref-tool", resume_session=OTHER_THREAD)
    assert by_type(events, "session")[0].resumed is False


def test_auth_failure_is_classified_from_turn_failed() -> None:
    events, _ = run("ref-401")
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert (terminal.reason, terminal.retryable) == ("auth", False)
    assert "401 Unauthorized" in terminal.error
    assert len(by_type(events, "session-error")) == 1  # "Reconnecting..." lines are not terminal


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("exceeded retry limit, last status: 429 Too Many Requests", "rate-limited"),
        ("Quota exceeded. Check your plan and billing details. insufficient_quota", "quota"),
        (
            "We're currently experiencing high demand, which may cause temporary errors.",
            "harness-error",
        ),
    ],
)
def test_turn_failed_is_classified(message: str, reason: str) -> None:
    line = {"type": "turn.failed", "error": {"message": message}}
    events, _ = replay(adapter, request_for("x"), json_lines(line), ExitInfo(exit_code=1))
    assert events[-1].reason == reason


def test_exit_after_error_line_without_turn_failed_is_classified_from_it() -> None:
    line = {"type": "error", "message": "unexpected status 429 Too Many Requests"}
    events, _ = replay(adapter, request_for("x"), json_lines(line), ExitInfo(exit_code=1))
    assert (events[-1].reason, events[-1].exit_code) == ("rate-limited", 1)


def test_file_change_and_mcp_items_become_activity_once() -> None:
    lines = [
        {
            "type": "item.started",
            "item": {
                "id": "i1",
                "type": "mcp_tool_call",
                "server": "s",
                "tool": "t",
                "status": "in_progress",
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "i1",
                "type": "mcp_tool_call",
                "server": "s",
                "tool": "t",
                "status": "completed",
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "i2",
                "type": "file_change",
                "changes": [
                    {"path": "/w/a.py", "kind": "add"},
                    {"path": "/w/b.py", "kind": "update"},
                ],
            },
        },
    ]
    events, _ = replay(adapter, request_for("x"), json_lines(*lines), ExitInfo(exit_code=0))
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="tool", description="s.t"),
        SandboxActivity(kind="file", description="add /w/a.py, update /w/b.py"),
    ]


# --- the command line --------------------------------------------------------------------


def test_first_turn_reads_prompt_from_stdin_via_dash() -> None:
    command = adapter.build_command(TurnRequest(input="hello", workspace="/w"))
    assert command.argv == ("codex", "exec", "--json", "--skip-git-repo-check", "-")
    assert command.stdin == b"hello"
    assert command.cwd == "/w"


def test_resumed_turn_uses_exec_resume_with_thread_id() -> None:
    command = adapter.build_command(TurnRequest(input="q", resume_session=THREAD))
    assert command.argv[:4] == ("codex", "exec", "resume", THREAD)
    assert command.argv[-1] == "-"


def test_requested_model_is_passed_with_model_flag() -> None:
    argv = adapter.build_command(TurnRequest(input="q", model="gpt-5.5")).argv
    assert argv[argv.index("--model") + 1] == "gpt-5.5"


@pytest.mark.parametrize(
    "prompt",
    [
        "plain",
        'with "quotes" and \\backslashes\\',
        "multi\nline\ttabs",
        "del\x7fchar ✓",
        "'''triple'''",
        '"""x"""',
    ],
)
def test_system_prompt_is_developer_instructions_in_valid_toml(prompt: str) -> None:
    command = adapter.build_command(TurnRequest(input="q", system_prompt=prompt))
    assert config(command)["developer_instructions"] == prompt
    assert prompt not in command.argv


def test_base_url_becomes_a_custom_responses_provider_with_the_granted_key_name() -> None:
    command = adapter.build_command(
        TurnRequest(
            input="q", base_url="http://127.0.0.1:9/v1", granted_env=frozenset({"OPENAI_API_KEY"})
        )
    )
    parsed = config(command)
    assert parsed["model_provider"] == "harness"
    provider = parsed["model_providers"]["harness"]
    assert provider == {
        "name": "harness",
        "base_url": "http://127.0.0.1:9/v1",
        "wire_api": "responses",
        "env_key": "OPENAI_API_KEY",
    }


def test_provider_key_name_is_a_granted_one_when_openai_key_is_not_granted() -> None:
    command = adapter.build_command(
        TurnRequest(input="q", base_url="http://x/v1", granted_env=frozenset({"MY_GATEWAY_KEY"}))
    )
    assert config(command)["model_providers"]["harness"]["env_key"] == "MY_GATEWAY_KEY"


def test_no_provider_is_configured_without_base_url() -> None:
    assert "model_providers" not in config(adapter.build_command(TurnRequest(input="q")))


@pytest.mark.parametrize(
    ("posture", "mode"),
    [("strict", "read-only"), ("auto", "danger-full-access"), ("dangerous", "danger-full-access")],
)
def test_posture_maps_to_sandbox_mode_and_never_asks(posture: str, mode: str) -> None:
    parsed = config(adapter.build_command(TurnRequest(input="q", posture=posture)))  # type: ignore[arg-type]
    assert (parsed["sandbox_mode"], parsed["approval_policy"]) == (mode, "never")


def test_policy_warning_says_what_codex_does_not_enforce() -> None:
    assert adapter.policy_warning(TurnRequest(input="q", posture="strict")) is None
    assert adapter.policy_warning(TurnRequest(input="q", posture="dangerous")) is None
    auto = adapter.policy_warning(TurnRequest(input="q", posture="auto"))
    assert auto is not None and "container" in auto
    patterns = adapter.policy_warning(TurnRequest(input="q", posture="strict", deny=("rm",)))
    assert patterns is not None and "allow/deny" in patterns


@pytest.mark.parametrize("text", ["-rf /", "--help", "x" * MIB])
def test_input_never_rides_in_argv(text: str) -> None:
    command = adapter.build_command(TurnRequest(input=text, resume_session=THREAD))
    assert_input_rides_on_stdin(command, text)


def test_granted_secrets_are_named_never_set() -> None:
    granted = frozenset({"OPENAI_API_KEY"})
    command = adapter.build_command(
        TurnRequest(input="q", granted_env=granted, base_url="http://x/v1")
    )
    assert not granted & set(command.env)
    assert "sk-" not in json.dumps([command.argv, dict(command.files)])


def test_input_over_the_cli_limit_is_invalid_input() -> None:
    tail = (
        "Error: turn/start: turn/start failed: Input exceeds the maximum length of 1048576 "
        'characters. (code -32602), data: {"input_error_code":"input_too_large"}\n'
    )
    events, _ = replay(adapter, request_for("x"), b"", ExitInfo(exit_code=1, stderr_tail=tail))
    assert (events[-1].reason, events[-1].retryable) == ("invalid-input", False)
