"""``--posture ask`` in the adapters: a request the harness waits on becomes an ``Ask`` (not an
event), and the decision goes back as the harness's own reply line."""

from __future__ import annotations

import json

import adapters
from adapters import stdio_json
from adapters.asks import Decision
from adapters.protocol import TurnRequest

ASK = TurnRequest(input="go", posture="ask", executable="/bin/h")
claude_code = adapters.get("claude-code")


def test_stdio_json_permission_line_waits_for_a_decision_line() -> None:
    command = stdio_json.build_command(ASK)
    assert command.keep_stdin and command.env["HARNESS_POSTURE"] == "ask"
    assert json.loads(command.stdin or b"") == {"type": "input", "text": "go"}
    state = stdio_json.new_state(ASK)
    line = {"type": "permission", "id": "a1", "description": "d", "command": "rm x"}
    assert stdio_json.map_message(line, state) == []
    [ask] = state.asks
    assert (ask.native_id, ask.command) == ("a1", "rm x")
    stdio_json.answer(state, ask, Decision(allow=False, message="no"))
    assert json.loads(state.outbox[0]) == {
        "type": "decision",
        "id": "a1",
        "decision": "deny",
        "scope": "once",
        "message": "no",
    }


def test_stdio_json_without_ask_only_reports_the_request() -> None:
    request = TurnRequest(input="go", executable="/bin/h")
    assert not stdio_json.build_command(request).keep_stdin
    state = stdio_json.new_state(request)
    [event] = stdio_json.map_message({"type": "permission", "id": "a1"}, state)
    assert event.type == "permission-request" and not state.asks


def test_claude_can_use_tool_becomes_an_ask_answered_on_stdin() -> None:
    command = claude_code.build_command(ASK)
    assert command.keep_stdin and "--permission-prompt-tool" in command.argv
    assert json.loads(command.stdin or b"")["message"]["content"] == "go"
    state = claude_code.new_state(ASK)
    message = {
        "type": "control_request",
        "request_id": "req-1",
        "request": {
            "subtype": "can_use_tool",
            "tool_name": "Bash",
            "input": {"command": "ls"},
            "tool_use_id": "toolu_1",
        },
    }
    assert claude_code.map_message(message, state) == []
    [ask] = state.asks
    assert (ask.tool, ask.command) == ("Bash", "ls")
    claude_code.answer(state, ask, Decision(allow=True))
    reply = json.loads(state.outbox.pop())
    assert reply["response"] == {
        "subtype": "success",
        "request_id": "req-1",
        "response": {"behavior": "allow", "updatedInput": {"command": "ls"}},
    }
    claude_code.answer(state, ask, Decision(allow=False, message="no", abort=True))
    verdict = json.loads(state.outbox.pop())["response"]["response"]
    assert verdict == {"behavior": "deny", "message": "no", "interrupt": True}
    # Its denial in the result line is not reported a second time.
    result = {
        "type": "result",
        "result": "ok",
        "permission_denials": [{"tool_use_id": "toolu_1", "tool_name": "Bash"}],
    }
    assert [e.type for e in claude_code.map_message(result, state)] == ["turn-complete"]


def test_claude_other_control_requests_are_refused_at_once() -> None:
    state = claude_code.new_state(ASK)
    claude_code.map_message(
        {"type": "control_request", "request_id": "r2", "request": {"subtype": "hook_callback"}},
        state,
    )
    assert not state.asks
    assert json.loads(state.outbox[0])["response"]["subtype"] == "error"
