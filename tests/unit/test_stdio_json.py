"""The stdio-json adapter against docs/events.md's protocol table, and the demo harness end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters import stdio_json
from adapters.events import (
    AssistantText,
    Event,
    PermissionRequest,
    SandboxActivity,
    Session,
    SessionError,
    TurnComplete,
    Usage,
)
from adapters.protocol import ExitInfo, TurnRequest
from adapters.stream import StreamDriver
from tests.helpers import assert_one_terminal
from worker.options.policy import fit_request

DEMO = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"


def _request(**kwargs: Any) -> TurnRequest:
    kwargs.setdefault("input", "hello")
    kwargs.setdefault("executable", "/usr/local/bin/my-harness")
    return TurnRequest(**kwargs)


def _map(messages: list[dict[str, Any]], **kwargs: Any) -> tuple[list[Event], Any]:
    state = stdio_json.new_state(_request(**kwargs))
    events: list[Event] = []
    for message in messages:
        events.extend(stdio_json.map_message(message, state))
    return events, state


# --- the protocol table, line by line ------------------------------------------------------


def test_session_line_becomes_session_not_resumed_when_nothing_offered() -> None:
    events, state = _map([{"type": "session", "id": "S1", "model": "M1"}])
    assert events == [Session(session_id="S1", resumed=False, model="M1")]
    assert state.session_id == "S1"
    assert state.model == "M1"


def test_session_resumed_when_id_equals_offered_session() -> None:
    events, _ = _map([{"type": "session", "id": "S1", "model": "M1"}], resume_session="S1")
    assert events == [Session(session_id="S1", resumed=True, model="M1")]


def test_session_not_resumed_when_id_differs_from_offered_session() -> None:
    events, _ = _map([{"type": "session", "id": "S2"}], resume_session="S1")
    assert events == [Session(session_id="S2", resumed=False, model=None)]


def test_session_line_without_id_ignored() -> None:
    events, state = _map([{"type": "session", "model": "M"}, {"type": "session", "id": ""}])
    assert events == []
    assert state.session_id is None


def test_text_line_becomes_assistant_text() -> None:
    events, _ = _map([{"type": "text", "text": "T"}])
    assert events == [AssistantText(text="T")]


@pytest.mark.parametrize("kind", ["command", "file", "tool", "other"])
def test_activity_line_becomes_sandbox_activity(kind: str) -> None:
    events, _ = _map([{"type": "activity", "kind": kind, "description": "D"}])
    assert events == [SandboxActivity(kind=kind, description="D")]  # type: ignore[arg-type]


def test_activity_of_unknown_kind_becomes_other() -> None:
    events, _ = _map([{"type": "activity", "kind": "network", "description": "D"}])
    assert events == [SandboxActivity(kind="other", description="D")]


def test_permission_line_becomes_permission_request() -> None:
    events, _ = _map([{"type": "permission", "id": "I", "description": "D", "command": "C"}])
    assert events == [PermissionRequest(request_id="I", description="D", command="C")]


def test_permission_without_command_has_null_command() -> None:
    events, _ = _map([{"type": "permission", "id": 7, "description": "D"}])
    assert events == [PermissionRequest(request_id="7", description="D", command=None)]


def test_usage_line_becomes_usage_from_harness() -> None:
    line = {"type": "usage", "input_tokens": 10, "output_tokens": 4, "cost_usd": 0.5}
    events, _ = _map([line])
    assert events == [Usage(input_tokens=10, output_tokens=4, cost_usd=0.5, source="harness")]


def test_usage_without_cost_has_null_cost() -> None:
    events, _ = _map([{"type": "usage", "input_tokens": 1, "output_tokens": 2}])
    assert events == [Usage(input_tokens=1, output_tokens=2, cost_usd=None)]


def test_usage_with_bad_numbers_counts_zero() -> None:
    line = {"type": "usage", "input_tokens": -3, "output_tokens": "9", "cost_usd": True}
    events, _ = _map([line])
    assert events == [Usage(input_tokens=0, output_tokens=0, cost_usd=None)]


def test_complete_line_becomes_turn_complete_with_session_and_totals() -> None:
    events, _ = _map(
        [
            {"type": "session", "id": "S", "model": "M"},
            {"type": "usage", "input_tokens": 10, "output_tokens": 4, "cost_usd": 0.5},
            {"type": "usage", "input_tokens": 5, "output_tokens": 1, "cost_usd": 0.25},
            {"type": "complete", "text": "T"},
        ]
    )
    assert events[-1] == TurnComplete(
        text="T", session_id="S", model="M", input_tokens=15, output_tokens=5, cost_usd=0.75
    )


def test_complete_without_usage_has_null_cost() -> None:
    events, _ = _map([{"type": "complete", "text": "T"}])
    assert events == [TurnComplete(text="T")]


def test_error_line_becomes_harness_error() -> None:
    events, state = _map([{"type": "error", "message": "M"}])
    assert len(events) == 1
    error = events[0]
    assert isinstance(error, SessionError)
    assert error.reason == "harness-error"
    assert error.error == "M"
    assert error.retryable is False
    assert state.resume_rejected is False


def test_error_without_message_still_readable() -> None:
    events, _ = _map([{"type": "error"}])
    assert isinstance(events[0], SessionError)
    assert events[0].error


@pytest.mark.parametrize(
    "message",
    [{"type": "thinking", "text": "x"}, {"kind": "text"}, {"type": 3}, {}],
)
def test_anything_else_ignored(message: dict[str, Any]) -> None:
    assert _map([message])[0] == []


def test_resume_rejected_when_session_not_found_and_session_offered() -> None:
    line = {"type": "error", "message": "no session", "code": "session-not-found"}
    _, state = _map([line], resume_session="stale")
    assert state.resume_rejected is True


def test_resume_not_rejected_when_nothing_offered() -> None:
    line = {"type": "error", "message": "no session", "code": "session-not-found"}
    _, state = _map([line])
    assert state.resume_rejected is False


def test_finish_adds_nothing() -> None:
    state = stdio_json.new_state(_request())
    assert stdio_json.finish(state, ExitInfo(0, "")) == []


# --- build_command ---------------------------------------------------------------------------


def test_build_command_puts_input_on_stdin_and_turn_in_env() -> None:
    command = stdio_json.build_command(_request(input="héllo $(rm -rf /)", turn=3))
    assert command.argv == ("/usr/local/bin/my-harness",)
    assert command.stdin == "héllo $(rm -rf /)".encode()
    assert dict(command.env) == {"HARNESS_TURN": "3"}
    assert command.cwd == "/workspace"


def test_build_command_sets_resume_session_env_when_offered() -> None:
    command = stdio_json.build_command(_request(resume_session="S1"))
    assert dict(command.env) == {"HARNESS_TURN": "1", "HARNESS_RESUME_SESSION": "S1"}


def test_build_command_uses_no_shell() -> None:
    command = stdio_json.build_command(_request(executable="my harness; rm -rf /"))
    # One argv element, passed as is: nothing for a shell to split or interpret.
    assert command.argv == ("my harness; rm -rf /",)


def test_build_command_refuses_missing_executable() -> None:
    with pytest.raises(ValueError, match="executable"):
        stdio_json.build_command(_request(executable=None))


def test_system_prompt_rides_in_the_input_put_there_by_the_worker() -> None:
    # No system-prompt channel: worker.options.policy.fit_request moves it into the input, once.
    request = fit_request(_request(input="Q", system_prompt="Be brief."), stdio_json.CAPABILITIES)
    assert stdio_json.build_command(request).stdin == b"Be brief.\n\nQ"


def test_build_command_handles_large_input_on_stdin() -> None:
    text = "x" * (1024 * 1024)
    command = stdio_json.build_command(_request(input=text))
    assert command.stdin is not None and len(command.stdin) == len(text)
    assert all(len(arg) < 1000 for arg in command.argv)


def test_policy_warning_unless_dangerous_and_no_patterns() -> None:
    assert stdio_json.policy_warning(_request(posture="strict")) is not None
    assert stdio_json.policy_warning(_request(posture="dangerous", allow=("Bash",))) is not None
    assert stdio_json.policy_warning(_request(posture="dangerous")) is None


# --- the demo harness end to end ------------------------------------------------------------


def _demo(
    tmp_path: Path,
    text: str,
    *,
    resume: str | None = None,
    turn: int = 1,
    max_line_bytes: int = 8 * 1024 * 1024,
) -> tuple[list[Event], StreamDriver]:
    """Run the demo harness as stdio-json says (input on stdin, env) and drive its stdout."""
    request = _request(input=text, turn=turn, resume_session=resume, executable=str(DEMO))
    command = stdio_json.build_command(request)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", **command.env}
    proc = subprocess.run(
        [sys.executable, *command.argv],
        input=command.stdin,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    driver = StreamDriver(stdio_json, request, max_line_bytes=max_line_bytes)
    events: list[Event] = []
    out = proc.stdout
    for start in range(0, len(out), 4096):  # chunks that cut lines anywhere
        events.extend(driver.feed(out[start : start + 4096]))
    events.extend(driver.finish(ExitInfo(proc.returncode, proc.stderr.decode())))
    assert_one_terminal(events)
    return events, driver


def test_demo_plain_input_completes(tmp_path: Path) -> None:
    events, driver = _demo(tmp_path, "what is up")
    assert [e.type for e in events] == [
        "turn-started",
        "session",
        "assistant-text",
        "sandbox-activity",
        "assistant-text",
        "usage",
        "turn-complete",
    ]
    session, complete = events[1], events[-1]
    assert isinstance(session, Session) and session.resumed is False
    assert session.model == "demo-1"
    assert isinstance(complete, TurnComplete)
    assert complete.text == "You said: what is up"
    assert complete.session_id == session.session_id
    assert complete.model == "demo-1"
    assert complete.input_tokens == 3 + 12
    assert complete.output_tokens == 9
    assert driver.counters.non_json == 0


def test_demo_resumes_session_when_offered_existing(tmp_path: Path) -> None:
    first, _ = _demo(tmp_path, "one")
    session = first[1]
    assert isinstance(session, Session)
    events, driver = _demo(tmp_path, "two", resume=session.session_id, turn=2)
    again = events[1]
    assert isinstance(again, Session)
    assert again.session_id == session.session_id
    assert again.resumed is True
    assert isinstance(events[-1], TurnComplete)
    assert "turn 2 of this session" in events[-1].text
    assert driver.state.resume_rejected is False


def test_demo_stale_resume_rejected(tmp_path: Path) -> None:
    events, driver = _demo(tmp_path, "hi", resume="demo-gone")
    assert [e.type for e in events] == ["turn-started", "session-error"]
    error = events[-1]
    assert isinstance(error, SessionError)
    assert error.reason == "harness-error"
    assert "demo-gone" in error.error
    assert driver.state.resume_rejected is True


def test_demo_text_and_usage_directives(tmp_path: Path) -> None:
    events, _ = _demo(tmp_path, "@text first words\n@usage 7 3 0.01\n@complete fin")
    assert [e.type for e in events] == [
        "turn-started",
        "session",
        "assistant-text",
        "usage",
        "turn-complete",
    ]
    assert events[2] == AssistantText(text="first words")
    assert events[3] == Usage(input_tokens=7, output_tokens=3, cost_usd=0.01)
    complete = events[-1]
    assert isinstance(complete, TurnComplete)
    assert (complete.text, complete.input_tokens, complete.cost_usd) == ("fin", 7, 0.01)


def test_demo_garbage_counted_and_bad_bytes_replaced(tmp_path: Path) -> None:
    events, driver = _demo(tmp_path, "@garbage")
    assert [e.type for e in events] == [
        "turn-started",
        "session",
        "assistant-text",
        "turn-complete",
    ]
    assert driver.counters.non_json == 2
    text = events[2]
    assert isinstance(text, AssistantText)
    assert text.text == "bad \ufffd\ufffd bytes"


def test_demo_twice_keeps_first_terminal(tmp_path: Path) -> None:
    events, driver = _demo(tmp_path, "@twice")
    assert isinstance(events[-1], TurnComplete)
    assert events[-1].text == "first"
    assert driver.counters.dropped_after_terminal == 1


def test_demo_exit_without_terminal_gives_exit_error(tmp_path: Path) -> None:
    events, _ = _demo(tmp_path, "@text partial\n@stderr dying now\n@exit 3")
    error = events[-1]
    assert isinstance(error, SessionError)
    assert error.reason == "exit"
    assert error.exit_code == 3
    assert error.retryable is True
    assert "dying now" in error.stderr_tail


def test_demo_error_directive_gives_harness_error(tmp_path: Path) -> None:
    events, driver = _demo(tmp_path, "@error the model melted")
    error = events[-1]
    assert isinstance(error, SessionError)
    assert error.reason == "harness-error"
    assert error.error == "the model melted"
    assert driver.state.resume_rejected is False


def test_demo_bigline_dropped_when_over_max_line_bytes(tmp_path: Path) -> None:
    events, driver = _demo(tmp_path, "@bigline 100000\n@text after", max_line_bytes=4096)
    assert [e.type for e in events] == [
        "turn-started",
        "session",
        "assistant-text",
        "turn-complete",
    ]
    assert events[2] == AssistantText(text="after")
    assert driver.counters.oversized == 1
    complete = events[-1]
    assert isinstance(complete, TurnComplete) and complete.text == "script done"


def test_demo_session_line_is_json_with_id_and_model(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(DEMO)],
        input=b"@complete ok",
        capture_output=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HARNESS_TURN": "1"},
        timeout=60,
        check=True,
    )
    first = json.loads(proc.stdout.splitlines()[0])
    assert first["type"] == "session"
    assert first["model"] == "demo-1"
    assert (tmp_path / ".demo-sessions" / first["id"]).exists()
