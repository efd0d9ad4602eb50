"""pi ``--posture ask``: ``pi --mode rpc`` with the shipped gate extension, mapped from lines
recorded with 0.73.1 against the fake model's ``edit`` scenario."""

from __future__ import annotations

import json
from typing import Any

import adapters
from adapters import pi_rpc
from adapters.asks import Decision
from adapters.protocol import TurnRequest

ASK = TurnRequest(
    input="[scenario:edit] go", posture="ask", model="fake-model", base_url="http://m/v1"
)
pi = adapters.get("pi")
CMD = "echo made-by-agent > agent.txt"
CALL = "call_695d"


def _sent(state: Any) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in state.outbox]
    state.outbox.clear()
    return lines


def _confirm(tool: str = "bash", value: Any = None) -> dict[str, Any]:
    asked = {"tool_name": tool, "tool_call_id": CALL, "input": value or {"command": CMD}}
    return {
        "type": "extension_ui_request",
        "id": "334066a0",
        "method": "confirm",
        "title": "harness-permission",
        "message": json.dumps(asked),
    }


def _assistant(content: list[dict[str, Any]], reason: str = "stop") -> dict[str, Any]:
    usage = {"input": 100, "output": 30, "cacheRead": 20, "cacheWrite": 0, "cost": {"total": 0}}
    message = {"role": "assistant", "content": content, "model": "fake-model", "usage": usage}
    return {"type": "message_end", "message": {**message, "stopReason": reason}}


def test_ask_runs_rpc_mode_with_the_gate_and_the_other_postures_do_not() -> None:
    command = pi.build_command(ASK)
    assert command.argv[:3] == ("pi", "--mode", "rpc") and "-p" not in command.argv
    assert command.keep_stdin
    path = "/workspace/.home/.pi/harness-ask-gate.ts"
    assert command.argv[command.argv.index("-e") + 1] == path
    assert "ctx.ui.confirm" in command.files[path]
    assert command.env["HARNESS_ASK_TOOLS"] == "bash,edit,write"
    state_line, prompt = [json.loads(line) for line in (command.stdin or b"").splitlines()]
    assert state_line["type"] == "get_state"
    assert (prompt["type"], prompt["message"]) == ("prompt", ASK.input)
    allowed = pi.build_command(
        TurnRequest(input="x", posture="ask", allow=("Bash",), deny=("Edit",))
    )
    assert allowed.env["HARNESS_ASK_TOOLS"] == "write"
    plain = pi.build_command(TurnRequest(input="x", posture="dangerous"))
    assert plain.argv[:4] == ("pi", "-p", "--mode", "json") and not plain.keep_stdin
    assert "-e" not in plain.argv and plain.stdin == b"x"


def test_recorded_turn_approved() -> None:
    state = pi.new_state(ASK)
    got = {"id": "harness-state", "type": "response", "command": "get_state", "success": True,
           "data": {"sessionId": "01a22f1d", "messageCount": 0}}  # fmt: skip
    assert pi.map_message(got, state) == [] and state.session_id == "01a22f1d"
    ok = {"id": "harness-prompt", "type": "response", "command": "prompt", "success": True}
    assert pi.map_message(ok, state) == []
    call = [{"type": "toolCall", "id": CALL, "name": "bash", "arguments": {"command": CMD}}]
    assert [e.type for e in pi.map_message(_assistant(call, "toolUse"), state)] == [
        "session",
        "usage",
    ]
    start = {"type": "tool_execution_start", "toolCallId": CALL, "toolName": "bash",
             "args": {"command": CMD}}  # fmt: skip
    pi.map_message(start, state)
    assert pi.map_message(_confirm(), state) == []
    [ask] = state.asks
    assert (ask.tool, ask.command, ask.input) == ("bash", CMD, {"command": CMD})
    pi.answer(state, ask, Decision(allow=True))
    assert _sent(state) == [{"type": "extension_ui_response", "id": "334066a0", "confirmed": True}]
    end = {"type": "tool_execution_end", "toolCallId": CALL, "toolName": "bash",
           "result": {"content": [{"type": "text", "text": "edit-ran\n"}]}, "isError": False}  # fmt: skip
    [activity] = pi.map_message(end, state)
    assert (activity.kind, activity.description) == ("command", CMD)
    pi.map_message(_assistant([{"type": "text", "text": "Done."}]), state)
    [complete] = pi.map_message({"type": "agent_end", "messages": []}, state)
    assert complete.type == "turn-complete" and complete.text == "Done."
    assert (complete.session_id, complete.input_tokens) == ("01a22f1d", 240)


def test_denied_aborted_and_foreign_dialogs() -> None:
    state = pi.new_state(ASK)
    pi.map_message(_confirm("write", {"path": "a.txt", "content": "x"}), state)
    [ask] = state.asks
    assert (ask.tool, ask.command, ask.description) == ("write", None, "write a.txt")
    pi_rpc.answer(state, ask, Decision(allow=False, message="no"))
    pi_rpc.answer(state, ask, Decision(allow=False, abort=True))
    assert [m.get("confirmed", m.get("cancelled")) for m in _sent(state)] == [False, True]
    other = {"type": "extension_ui_request", "id": "x", "method": "select", "title": "t"}
    pi.map_message(other, state)
    assert _sent(state) == [{"type": "extension_ui_response", "id": "x", "cancelled": True}]
    note = {"type": "extension_ui_request", "id": "y", "method": "notify", "message": "hi"}
    assert pi.map_message(note, state) == [] and not state.outbox and len(state.asks) == 1


def test_failed_reply_ends_the_rpc_turn_at_agent_end() -> None:
    state = pi.new_state(ASK)
    failed = _assistant([], "error")
    failed["message"]["errorMessage"] = "429 Too Many Requests"
    pi.map_message(failed, state)
    *_, error = pi.map_message({"type": "agent_end", "messages": []}, state)
    assert error.type == "session-error" and error.reason == "rate-limited"
    refused = {"type": "response", "command": "prompt", "success": False, "error": "busy"}
    [event] = pi.map_message(refused, pi.new_state(ASK))
    assert event.type == "session-error" and "busy" in event.error
