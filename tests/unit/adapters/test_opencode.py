"""opencode adapter: recorded real output of opencode-ai 1.18.33, and its command line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import (
    ARG_MAX_STRLEN,
    MIB,
    ONE_REPLY_TURN,
    RecordedHarness,
    adapter_command_fields,
    assert_input_rides_on_stdin,
    by_type,
    event_types,
    json_lines,
    replay,
    stdout_lines,
)

from adapters import opencode as adapter
from adapters.events import PermissionRequest, SandboxActivity, SessionError, TurnComplete
from adapters.protocol import ExitInfo, TurnRequest

HARNESS = adapter.HARNESS_ID
SESSION = "ses_dd5ec3416ffevdFQW7mcoaLuTn"  # tool.ndjson, then resume.ndjson
HOME = "/workspace/.home"
CONFIG = f"{HOME}/.config/opencode/opencode.json"
RECORDED = RecordedHarness(adapter, request_fields=adapter_command_fields, session=SESSION)
request_for = RECORDED.request_for
run = RECORDED.run


def config(command: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(command.files[CONFIG])
    return loaded


# --- recorded streams (what every harness must do is in test_every_adapter.py) -----------


def test_text_turn_completes_at_exit_with_answer_and_no_model() -> None:
    events, driver = run("ref-text")
    assert event_types(events) == ONE_REPLY_TURN
    session, terminal = events[1], events[-1]
    assert (session.session_id, session.resumed, session.model) == (
        "ses_dd5fad719ffeatjQIg5beit13j",
        False,
        None,
    )
    assert isinstance(terminal, TurnComplete)
    assert (terminal.text, terminal.model, terminal.exit_code) == (
        "Hello from the fake model.",
        None,
        0,
    )
    assert driver.state.model is None


def test_step_with_stop_is_not_terminal_before_exit() -> None:
    events, driver = run("ref-text", ExitInfo(exit_code=None))
    assert not any(isinstance(e, TurnComplete) for e in events)
    assert isinstance(driver.terminal, SessionError) and driver.terminal.reason == "exit"


def test_nonzero_exit_after_a_stop_step_is_an_error_not_a_completion() -> None:
    events, _ = run("ref-text", ExitInfo(exit_code=1, stderr_tail="boom"))
    assert isinstance(events[-1], SessionError)
    assert (events[-1].reason, events[-1].exit_code) == ("exit", 1)


def test_steps_after_a_stop_step_decide_the_answer() -> None:
    # After an automatic compaction opencode's summary step ends with "stop" and the loop
    # goes on; only the last step's text is the answer.
    lines = stdout_lines(HARNESS, "ref-text")
    later = [line.replace(b"Hello from the fake model.", b"the real answer") for line in lines]
    events, _ = replay(adapter, request_for("ref-text"), lines + later, ExitInfo(exit_code=0))
    assert isinstance(events[-1], TurnComplete)
    assert events[-1].text == "the real answer"
    assert (events[-1].input_tokens, events[-1].output_tokens) == (24, 14)


def test_tool_turn_reports_command_usage_per_step_and_sums_them() -> None:
    events, _ = run("ref-tool")
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="command", description="echo tool-ok")
    ]
    assert [(u.input_tokens, u.output_tokens) for u in by_type(events, "usage")] == [
        (321, 45),
        (321, 45),
    ]
    terminal = events[-1]
    assert isinstance(terminal, TurnComplete)
    assert (terminal.text, terminal.session_id) == ("Tool finished; final answer ✓", SESSION)
    assert (terminal.input_tokens, terminal.output_tokens, terminal.cost_usd) == (642, 90, 0.0)


def test_cache_reads_count_as_input_and_as_cached_input() -> None:
    events, _ = run("permission-denied")
    usage = by_type(events, "usage")[0]
    # step_finish said input 100, cache.read 20: the prompt was 120 tokens.
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (120, 20, 30)


def test_cost_is_null_for_a_model_described_by_base_url() -> None:
    events, _ = run("ref-tool", base_url="http://127.0.0.1:9/v1", model="m")
    assert {u.cost_usd for u in by_type(events, "usage")} == {None}
    assert events[-1].cost_usd is None


def test_cost_sums_the_steps_that_opencode_priced() -> None:
    events, _ = run("priced")
    # 100 fresh input tokens at $3/M plus 30 output tokens at $15/M, per step.
    assert [u.cost_usd for u in by_type(events, "usage")] == [0.00075, 0.00075]
    assert events[-1].cost_usd == pytest.approx(0.0015)


def test_stale_session_sets_resume_rejected_and_ends_with_one_error() -> None:
    events, driver = run("badresume")
    assert driver.state.resume_rejected is True
    assert event_types(events) == ["turn-started", "session-error"]
    assert events[-1].exit_code == 1
    assert "\x1b[" not in events[-1].stderr_tail


def test_session_not_found_without_an_offered_session_is_no_resume_rejection() -> None:
    _, driver = run("badresume", resume_session=None)
    assert driver.state.resume_rejected is False


@pytest.mark.parametrize(
    ("scenario", "reason", "retryable", "retry_after"),
    [
        ("ref-401", "auth", False, None),
        ("http-429", "rate-limited", True, 7.0),
        ("quota", "quota", False, None),
    ],
)
def test_api_error_line_is_classified(
    scenario: str, reason: str, retryable: bool, retry_after: float | None
) -> None:
    events, _ = run(scenario)
    assert event_types(events) == ["turn-started", "session", "session-error"]
    error = events[-1]
    assert (error.reason, error.retryable, error.retry_after_s) == (reason, retryable, retry_after)
    assert error.error.startswith("opencode APIError (HTTP ")


def test_server_error_is_retryable_as_opencode_marks_it() -> None:
    line = stdout_lines(HARNESS, "ref-401")[0]
    data = json.loads(line)
    data["error"]["data"].update(statusCode=500, message="upstream broke", responseBody="{}")
    for marked in (True, False):
        data["error"]["data"]["isRetryable"] = marked
        events, _ = replay(adapter, request_for("x"), json_lines(data), ExitInfo(1))
        assert (events[-1].reason, events[-1].retryable) == ("harness-error", marked)


def test_retry_after_ms_header_wins_over_seconds() -> None:
    data = json.loads(stdout_lines(HARNESS, "http-429")[0])
    data["error"]["data"]["responseHeaders"]["retry-after-ms"] = "1500"
    events, _ = replay(adapter, request_for("x"), json_lines(data), ExitInfo(1))
    assert events[-1].retry_after_s == 1.5


def test_rejected_permission_is_reported_and_fails_the_turn_at_exit_zero() -> None:
    events, _ = run("permission-rejected")
    (request,) = by_type(events, "permission-request")
    assert request == PermissionRequest(
        request_id="call_cc55429b3fef472c838eaeca",
        description="echo tool-ran-$((6*7)) (failed: The user rejected permission to use this "
        "specific tool call.)",
        command="echo tool-ran-$((6*7))",
    )
    terminal = events[-1]
    assert isinstance(terminal, SessionError)
    assert (terminal.reason, terminal.exit_code) == ("harness-error", 0)
    assert "rejecting a permission" in terminal.error


def test_denied_command_is_a_failed_activity_and_the_turn_goes_on() -> None:
    events, _ = run("permission-denied")
    (activity,) = by_type(events, "sandbox-activity")
    assert activity.kind == "command"
    assert activity.description.startswith("echo tool-ran-$((6*7)) (failed: The user has specified")
    assert not by_type(events, "permission-request")
    assert isinstance(events[-1], TurnComplete)


@pytest.mark.parametrize(
    ("tool", "state", "kind", "description"),
    [
        ("edit", {"input": {"filePath": "/w/a.py"}}, "file", "edit /w/a.py"),
        ("write", {"input": {"filePath": "/w/b.txt"}}, "file", "write /w/b.txt"),
        ("read", {"title": "a.py"}, "tool", "read a.py"),
        ("webfetch", {}, "tool", "webfetch"),
    ],
)
def test_tools_map_to_activity_kinds(
    tool: str, state: dict[str, Any], kind: str, description: str
) -> None:
    line = json.loads(stdout_lines(HARNESS, "ref-tool")[1])
    line["part"].update(tool=tool, state={"status": "completed", **state})
    events, _ = replay(adapter, request_for("x"), json_lines(line), ExitInfo(0))
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind=kind, description=description)
    ]


# --- the command line --------------------------------------------------------------------


def test_first_turn_runs_json_mode_with_the_input_on_stdin() -> None:
    command = adapter.build_command(TurnRequest(input="hello", workspace="/w", home="/w/.home"))
    assert command.argv == ("opencode", "run", "--format", "json")
    assert command.stdin == b"hello"
    assert command.cwd == "/w"
    assert "/w/.home/.config/opencode/opencode.json" in command.files


def test_resumed_turn_passes_the_session_id() -> None:
    command = adapter.build_command(TurnRequest(input="q", resume_session=SESSION))
    assert command.argv[-2:] == ("--session", SESSION)
    assert "--session" not in adapter.build_command(TurnRequest(input="q")).argv


def test_input_starting_with_a_dash_stays_out_of_argv() -> None:
    command = adapter.build_command(TurnRequest(input="--help me", model="m"))
    assert_input_rides_on_stdin(command, "--help me")


def test_one_mib_input_goes_whole_on_stdin() -> None:
    text = "ä" * (MIB // 2) + "x" * 7
    command = adapter.build_command(TurnRequest(input=text, base_url="http://h/v1", model="m"))
    assert_input_rides_on_stdin(command, text)
    assert all(len(value.encode()) < ARG_MAX_STRLEN for value in command.env.values())


def test_base_url_defines_an_openai_compatible_provider_for_the_model() -> None:
    request = TurnRequest(input="q", base_url="http://127.0.0.1:5/v1", model="org/fake-1",
                          granted_env=frozenset({"OPENAI_API_KEY", "OTHER"}))  # fmt: skip
    command = adapter.build_command(request)
    assert command.argv[-2:] == ("-m", "harness/org/fake-1")
    provider = config(command)["provider"]["harness"]
    assert provider == {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": "http://127.0.0.1:5/v1", "apiKey": "{env:OPENAI_API_KEY}"},
        "models": {"org/fake-1": {"name": "org/fake-1"}},
    }
    assert command.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


def test_api_key_names_the_opencode_grant_first_and_is_left_out_without_grants() -> None:
    both = frozenset({"OPENAI_API_KEY", "OPENCODE_API_KEY"})
    command = adapter.build_command(
        TurnRequest(input="q", base_url="http://h/v1", model="m", granted_env=both)
    )
    assert config(command)["provider"]["harness"]["options"]["apiKey"] == "{env:OPENCODE_API_KEY}"
    bare = adapter.build_command(TurnRequest(input="q", base_url="http://h/v1", model="m"))
    assert "apiKey" not in config(bare)["provider"]["harness"]["options"]


def test_no_secret_value_reaches_argv_env_or_files() -> None:
    request = TurnRequest(input="q", base_url="http://h/v1", model="m", system_prompt="s",
                          granted_env=frozenset({"OPENAI_API_KEY"}))  # fmt: skip
    command = adapter.build_command(request)
    text = json.dumps([command.argv, dict(command.env), dict(command.files)])
    # The only mention of the grant is opencode's substitution of its name.
    assert text.count("OPENAI_API_KEY") == 1
    assert "{env:OPENAI_API_KEY}" in command.files[CONFIG]
    assert not [name for name in command.env if "KEY" in name or "TOKEN" in name]


def test_model_without_base_url_is_passed_as_provider_slash_model() -> None:
    command = adapter.build_command(TurnRequest(input="q", model="anthropic/claude-x"))
    assert command.argv[-2:] == ("-m", "anthropic/claude-x")
    assert "provider" not in config(command)
    assert "OPENCODE_DISABLE_MODELS_FETCH" not in command.env


def test_base_url_without_a_model_is_refused() -> None:
    with pytest.raises(ValueError, match="model"):
        adapter.build_command(TurnRequest(input="q", base_url="http://h/v1"))


def test_system_prompt_is_an_instructions_file_in_home() -> None:
    command = adapter.build_command(TurnRequest(input="q", system_prompt="Be terse.\n-x"))
    path = f"{HOME}/.config/opencode/harness-system-prompt.md"
    assert command.files[path] == "Be terse.\n-x"
    assert config(command)["instructions"] == ["/workspace/AGENTS.md", path]
    plain = adapter.build_command(TurnRequest(input="q"))
    assert config(plain)["instructions"] == ["/workspace/AGENTS.md"]
    assert len(plain.files) == 1


def test_project_config_is_disabled_and_our_config_dir_is_named() -> None:
    command = adapter.build_command(TurnRequest(input="q", home="/w/h"))
    assert command.env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1"
    assert command.env["XDG_CONFIG_HOME"] == "/w/h/.config"


@pytest.mark.parametrize(
    ("posture", "edit", "bash"),
    [("strict", "deny", "deny"), ("auto", "allow", "deny"), ("dangerous", None, None)],
)
def test_posture_becomes_opencode_permissions(posture: Any, edit: str, bash: str) -> None:
    rules = config(adapter.build_command(TurnRequest(input="q", posture=posture)))["permission"]
    if posture == "dangerous":
        assert rules == {"*": "allow"}
        return
    assert (rules["edit"], rules["bash"], rules["webfetch"]) == (edit, bash, "deny")
    assert rules["external_directory"] == "deny"
    assert "ask" not in json.dumps(rules)


def test_allow_and_deny_patterns_become_ordered_rules_with_deny_last() -> None:
    request = TurnRequest(
        input="q",
        posture="auto",
        allow=("Bash(git status:*)", "Bash(npm test)", "WebFetch", "Bash(rm *)"),
        deny=("Bash(rm *)", "Write(secrets/*)"),
    )
    rules = adapter.permission_config(request)
    assert rules["bash"] == {
        "*": "deny",
        "git status*": "allow",
        "npm test": "allow",
        "rm *": "deny",
    }
    assert list(rules["bash"])[-1] == "rm *"
    assert rules["webfetch"] == "allow"
    assert rules["edit"] == {"*": "allow", "secrets/*": "deny"}
    assert adapter.policy_warning(request) is None


def test_deny_applies_in_the_dangerous_posture() -> None:
    rules = adapter.permission_config(
        TurnRequest(input="q", posture="dangerous", deny=("Bash", "Edit(/etc/*)"))
    )
    assert rules == {"*": "allow", "bash": "deny", "edit": {"*": "allow", "/etc/*": "deny"}}


def test_policy_warning_names_patterns_opencode_cannot_apply() -> None:
    request = TurnRequest(input="q", allow=("mcp__db__query",), deny=("Bash(rm *)", "NoSuch()"))
    warning = adapter.policy_warning(request)
    assert warning is not None and "mcp__db__query" in warning and "NoSuch()" in warning
    assert "Bash(rm *)" not in warning
    assert adapter.policy_warning(TurnRequest(input="q", posture="strict")) is None


def test_capabilities_state_what_the_adapter_implements() -> None:
    caps = adapter.CAPABILITIES.as_dict()
    assert caps["permission_policy"] == "full"
    assert caps["model_reporting"] is False
    assert caps["session_resume"] and caps["system_prompt"] and caps["model_selection"]
