"""pi adapter: recorded real output of pi-coding-agent 0.73.1, and its command line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import (
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

from adapters import pi as adapter
from adapters.events import SandboxActivity, SessionError, TurnComplete
from adapters.protocol import ExitInfo, TurnRequest

HARNESS = adapter.HARNESS_ID
SESSION = "01a22a13-d67a-70fe-be55-8be9fd3bf9bd"  # tool.ndjson, then resume.ndjson
HOME = "/workspace/.home"
MODELS = f"{HOME}/.pi/agent/models.json"
RECORDED = RecordedHarness(adapter, request_fields=adapter_command_fields, session=SESSION)
request_for = RECORDED.request_for
run = RECORDED.run


def argv_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# --- recorded streams (what every harness must do is in test_every_adapter.py) -----------


def test_text_turn_reports_session_without_model_then_completes_at_agent_end() -> None:
    events, driver = run("ref-text")
    assert event_types(events) == ONE_REPLY_TURN
    session, terminal = events[1], events[-1]
    # pi names the model it was told to use (model_reporting is false): no model is reported.
    assert driver.state.model == "fake-model"
    assert (session.session_id, session.resumed, session.model) == (
        "01a22a05-396a-76da-9c1e-9cd93caaf1ee",
        False,
        None,
    )
    assert isinstance(terminal, TurnComplete)
    assert (terminal.text, terminal.model, terminal.input_tokens, terminal.output_tokens) == (
        "Hello from the fake model.",
        None,
        12,
        7,
    )
    assert terminal.cost_usd == pytest.approx(0.000026)
    assert driver.counters.dropped_after_terminal == 0
    assert driver.state.model == "fake-model"


def test_partial_usage_in_message_updates_is_not_counted() -> None:
    # tool.ndjson repeats the running usage in six message_update lines; two replies count.
    events, _ = run("ref-tool")
    usages = by_type(events, "usage")
    assert [(u.input_tokens, u.output_tokens) for u in usages] == [(321, 45), (321, 45)]
    terminal = events[-1]
    assert (terminal.input_tokens, terminal.output_tokens) == (642, 90)
    assert terminal.cost_usd == pytest.approx(0.000822)


def test_tool_turn_reports_the_command_and_the_last_reply_as_answer() -> None:
    events, _ = run("ref-tool")
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind="command", description="echo tool-ok")
    ]
    assert events[-1].text == "Tool finished; final answer ✓"
    assert events[-1].session_id == SESSION


def test_cost_is_null_for_a_model_described_by_base_url() -> None:
    events, _ = run("ref-tool", base_url="http://127.0.0.1:9/v1", model="fake-model")
    assert {u.cost_usd for u in by_type(events, "usage")} == {None}
    assert events[-1].cost_usd is None


def test_cache_reads_count_as_input_and_as_cached_input() -> None:
    line = json.loads(stdout_lines(HARNESS, "ref-text")[9])
    assert line["type"] == "message_end"
    line["message"]["usage"].update(input=70, cacheRead=30, cacheWrite=5)
    events, _ = replay(adapter, request_for("x"), json_lines(line), ExitInfo(0))
    (usage,) = by_type(events, "usage")
    assert (usage.input_tokens, usage.cached_input_tokens) == (105, 30)


def test_stale_session_sets_resume_rejected_and_ends_with_one_error() -> None:
    events, driver = run("badresume")
    assert driver.state.resume_rejected is True
    assert event_types(events) == ["turn-started", "session-error"]
    assert (events[-1].exit_code, events[-1].reason) == (1, "harness-error")


def test_api_error_at_exit_zero_is_a_session_error_not_a_completion() -> None:
    events, _ = run("ref-401")
    assert event_types(events) == ["turn-started", "session", "session-error"]
    error = events[-1]
    assert (error.reason, error.retryable, error.exit_code) == ("auth", False, 0)
    assert error.error == "pi: 401 acceptance: invalid api key"
    assert events[1].model is None  # pi's echo of the requested model is not a report


@pytest.mark.parametrize(
    ("scenario", "reason", "retryable", "retry_after"),
    [("http-429", "rate-limited", True, 7.0), ("quota", "quota", False, None)],
)
def test_error_after_pi_gave_up_retrying_is_classified(
    scenario: str, reason: str, retryable: bool, retry_after: float | None
) -> None:
    events, driver = run(scenario)
    # Four attempts (agent_end with an error, auto_retry_start, ...), then auto_retry_end.
    assert len([m for m in stdout_lines(HARNESS, scenario) if b'"agent_end"' in m]) == 4
    assert event_types(events) == ["turn-started", "session", "session-error"]
    error = events[-1]
    assert (error.reason, error.retryable, error.retry_after_s) == (reason, retryable, retry_after)
    assert driver.counters.dropped_after_terminal == 0


def test_failed_attempt_then_successful_retry_completes() -> None:
    failed = stdout_lines(HARNESS, "http-429")[:10]  # session … agent_end, auto_retry_start
    assert json.loads(failed[-1])["type"] == "auto_retry_start"
    ok = [line for line in stdout_lines(HARNESS, "ref-text")[1:]]
    events, _ = replay(adapter, request_for("http-429"), failed + ok, ExitInfo(exit_code=0))
    assert isinstance(events[-1], TurnComplete)
    assert events[-1].text == "Hello from the fake model."
    assert len(by_type(events, "session")) == 1


@pytest.mark.parametrize(
    ("tool", "args", "kind", "description"),
    [
        ("edit", {"path": "a.py", "oldText": "x"}, "file", "edit a.py"),
        ("write", {"path": "b.txt", "content": "y"}, "file", "write b.txt"),
        ("read", {"path": "a.py"}, "tool", 'read {"path": "a.py"}'),
    ],
)
def test_tools_map_to_activity_kinds(
    tool: str, args: dict[str, Any], kind: str, description: str
) -> None:
    start = {"type": "tool_execution_start", "toolCallId": "c1", "toolName": tool, "args": args}
    end = {"type": "tool_execution_end", "toolCallId": "c1", "toolName": tool, "isError": False}
    events, _ = replay(adapter, request_for("x"), json_lines(start, end), ExitInfo(0))
    assert by_type(events, "sandbox-activity") == [
        SandboxActivity(kind=kind, description=description)
    ]


def test_failed_tool_call_is_marked_failed() -> None:
    lines = [json.loads(line) for line in stdout_lines(HARNESS, "ref-tool")]
    end = next(m for m in lines if m["type"] == "tool_execution_end")
    end.update(isError=True, result={"content": [{"type": "text", "text": "Tool bash not found"}]})
    start = next(m for m in lines if m["type"] == "tool_execution_start")
    events, _ = replay(adapter, request_for("x"), json_lines(start, end), ExitInfo(0))
    assert by_type(events, "sandbox-activity")[0].description == "echo tool-ok (failed)"


def test_exit_without_agent_end_still_announces_the_session_before_the_error() -> None:
    lines = stdout_lines(HARNESS, "ref-text")[:3]  # header, agent_start, turn_start
    events, _ = replay(adapter, request_for("x"), lines, ExitInfo(exit_code=143))
    assert event_types(events) == ["turn-started", "session", "session-error"]
    assert events[1].model is None
    assert isinstance(events[-1], SessionError) and events[-1].reason == "exit"


# --- the command line --------------------------------------------------------------------


def test_first_turn_runs_json_print_mode_with_the_input_on_stdin() -> None:
    command = adapter.build_command(TurnRequest(input="hello", workspace="/w", home="/w/.home"))
    assert command.argv[:4] == ("pi", "-p", "--mode", "json")
    assert command.stdin == b"hello"
    assert command.cwd == "/w"
    assert "--session" not in command.argv
    assert command.env == {"PI_OFFLINE": "1", "PI_CODING_AGENT_DIR": "/w/.home/.pi/agent"}


def test_resumed_turn_passes_the_session_id() -> None:
    command = adapter.build_command(TurnRequest(input="q", resume_session=SESSION))
    assert argv_value(command.argv, "--session") == SESSION


@pytest.mark.parametrize("text", ["-p oops", "@/etc/passwd", "--help"])
def test_input_pi_would_take_for_an_option_or_file_stays_out_of_argv(text: str) -> None:
    assert_input_rides_on_stdin(adapter.build_command(TurnRequest(input=text)), text)


def test_one_mib_input_and_system_prompt_stay_out_of_argv() -> None:
    text = "ä" * (MIB // 2) + "x" * 7
    request = TurnRequest(input=text, system_prompt="s" * MIB, base_url="http://h/v1", model="m")
    command = adapter.build_command(request)
    assert_input_rides_on_stdin(command, text)


def test_base_url_defines_a_provider_whose_api_key_names_the_grant() -> None:
    request = TurnRequest(input="q", base_url="http://127.0.0.1:5/v1", model="fake-1",
                          granted_env=frozenset({"OPENAI_API_KEY", "ZZZ"}))  # fmt: skip
    command = adapter.build_command(request)
    assert (argv_value(command.argv, "--provider"), argv_value(command.argv, "--model")) == (
        "harness",
        "fake-1",
    )
    models = json.loads(command.files[MODELS])
    assert models == {
        "providers": {
            "harness": {
                "baseUrl": "http://127.0.0.1:5/v1",
                "api": "openai-completions",
                "apiKey": "OPENAI_API_KEY",
                "models": [{"id": "fake-1", "name": "fake-1"}],
            }
        }
    }


def test_api_key_prefers_the_pi_grant_and_never_holds_a_value() -> None:
    def key(granted: set[str]) -> str:
        request = TurnRequest(input="q", base_url="http://h/v1", model="m",
                              granted_env=frozenset(granted))  # fmt: skip
        value: str = json.loads(adapter.build_command(request).files[MODELS])["providers"][
            "harness"
        ]["apiKey"]
        return value

    assert key({"OPENAI_API_KEY", "PI_API_KEY"}) == "PI_API_KEY"
    assert key({"B_KEY", "A_KEY"}) == "A_KEY"
    # pi needs some apiKey for a provider; an unset name is sent as is, never a secret.
    assert key(set()) == "PI_API_KEY"


def test_no_secret_value_reaches_argv_env_or_files() -> None:
    request = TurnRequest(input="q", base_url="http://h/v1", model="m", system_prompt="s",
                          granted_env=frozenset({"OPENAI_API_KEY"}))  # fmt: skip
    command = adapter.build_command(request)
    text = json.dumps([command.argv, dict(command.env), dict(command.files)])
    assert text.count("OPENAI_API_KEY") == 1  # the models.json apiKey: a variable name
    assert not [name for name in command.env if "KEY" in name or "TOKEN" in name]
    assert "--api-key" not in command.argv


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("anthropic/claude-x", ["--provider", "anthropic", "--model", "claude-x"]),
        ("gpt-4o", ["--model", "gpt-4o"]),
    ],
)
def test_model_without_base_url_uses_pi_builtin_providers(model: str, expected: list[str]) -> None:
    command = adapter.build_command(TurnRequest(input="q", model=model))
    argv = list(command.argv)
    assert argv[4 : 4 + len(expected)] == expected
    assert MODELS not in command.files


def test_base_url_without_a_model_is_refused() -> None:
    with pytest.raises(ValueError, match="model"):
        adapter.build_command(TurnRequest(input="q", base_url="http://h/v1"))


def test_system_prompt_is_appended_from_a_file_in_home() -> None:
    command = adapter.build_command(TurnRequest(input="q", system_prompt="-Be terse."))
    path = argv_value(command.argv, "--append-system-prompt")
    assert path == f"{HOME}/.pi/harness-system-prompt.md"
    assert command.files[path] == "-Be terse."
    assert "--append-system-prompt" not in adapter.build_command(TurnRequest(input="q")).argv


@pytest.mark.parametrize(
    ("posture", "tools"),
    [
        ("strict", "read,grep,find,ls"),
        ("auto", "read,grep,find,ls,edit,write"),
        ("dangerous", "read,bash,edit,write,grep,find,ls"),
    ],
)
def test_posture_becomes_a_tool_allowlist(posture: Any, tools: str) -> None:
    command = adapter.build_command(TurnRequest(input="q", posture=posture))
    assert argv_value(command.argv, "--tools") == tools


def test_whole_tool_patterns_are_applied_and_scoped_ones_fail_closed() -> None:
    request = TurnRequest(
        input="q",
        posture="auto",
        allow=("Bash", "Bash(git status:*)", "Glob"),
        deny=("Write", "Edit(secrets/*)"),
    )
    assert adapter.tools_for(request) == ["read", "grep", "find", "ls", "bash"]
    scoped_allow = TurnRequest(input="q", posture="strict", allow=("Bash(git status:*)",))
    assert "bash" not in adapter.tools_for(scoped_allow)
    scoped_deny = TurnRequest(input="q", posture="dangerous", deny=("Bash(rm *)",))
    assert "bash" not in adapter.tools_for(scoped_deny)


def test_everything_denied_means_no_tools() -> None:
    request = TurnRequest(input="q", posture="strict", deny=("Read", "Grep", "Glob", "LS"))
    command = adapter.build_command(request)
    assert "--no-tools" in command.argv and "--tools" not in command.argv


def test_policy_warning_names_patterns_pi_cannot_apply_exactly() -> None:
    request = TurnRequest(input="q", allow=("Bash", "Bash(git:*)"), deny=("Edit(x)", "mcp__q"))
    warning = adapter.policy_warning(request)
    assert warning is not None
    for pattern in ("Bash(git:*)", "Edit(x)", "mcp__q"):
        assert pattern in warning
    assert "Bash," not in warning
    assert adapter.policy_warning(TurnRequest(input="q", allow=("Bash",), deny=("Write",))) is None
