"""``--posture ask`` over ACP (``gemini --acp``, ``opencode acp``): the shared client's
requests, its mapping of recorded agent messages (gemini 0.61.0, opencode 1.18.33 against the
fake model's ``edit`` scenario) and its answers by option kind."""

from __future__ import annotations

import json
from typing import Any

import adapters
from adapters.asks import Decision
from adapters.events import Event
from adapters.protocol import TurnRequest

gemini = adapters.get("gemini")
opencode = adapters.get("opencode")
WS = "/workspace"
CMD = "echo agent-line >> README.md && echo made-by-agent > agent.txt && echo edit-ran"
GEMINI_ASK = TurnRequest(input="[scenario:edit] go", posture="ask", model="gemini-2.5-flash")
OPENCODE_ASK = TurnRequest(
    input="[scenario:edit] go", posture="ask", model="fake-model", base_url="http://m/v1"
)


def _sent(state: Any) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in state.outbox]
    state.outbox.clear()
    return lines


def _update(session: str, update: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session, "update": update},
    }


GEMINI_PERMISSION = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "session/request_permission",
    "params": {
        "sessionId": "9396",
        "options": [
            {
                "optionId": "proceed_always",
                "name": "Allow for this session",
                "kind": "allow_always",
            },
            {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
            {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
        ],
        "toolCall": {
            "toolCallId": "run_shell_command__run_shell_command_1",
            "status": "pending",
            "title": CMD,
            "content": [{"type": "content", "content": {"type": "text", "text": "[cwd] (Print)"}}],
            "locations": [],
            "kind": "execute",
        },
    },
}


def _open(adapter: Any, request: Any, session: str) -> Any:
    """A state through initialize and session/new, with the prompt sent."""
    state = adapter.new_state(request)
    assert adapter.map_message({"jsonrpc": "2.0", "id": 1, "result": {}}, state) == []
    [new] = _sent(state)
    assert (new["method"], new["params"]) == ("session/new", {"cwd": WS, "mcpServers": []})
    adapter.map_message({"jsonrpc": "2.0", "id": 2, "result": {"sessionId": session}}, state)
    [prompt] = _sent(state)
    assert prompt["method"] == "session/prompt"
    assert prompt["params"] == {
        "sessionId": session,
        "prompt": [{"type": "text", "text": request.input}],
    }
    return state


def _types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def test_gemini_ask_runs_acp_and_the_other_postures_do_not() -> None:
    command = gemini.build_command(GEMINI_ASK)
    assert command.argv[:2] == ("gemini", "--acp") and command.keep_stdin
    assert "--prompt" not in command.argv and "--output-format" not in command.argv
    assert command.argv[command.argv.index("--approval-mode") + 1] == "default"
    first = json.loads(command.stdin or b"")
    assert (first["id"], first["method"]) == (1, "initialize")
    assert first["params"]["clientCapabilities"]["terminal"] is False
    resumed = gemini.build_command(TurnRequest(input="x", posture="ask", resume_session="s"))
    assert "--resume" not in resumed.argv  # session/load instead
    plain = gemini.build_command(TurnRequest(input="x", posture="auto"))
    assert "--acp" not in plain.argv and not plain.keep_stdin and plain.stdin == b"x"
    assert gemini.policy_warning(GEMINI_ASK) is not None


def test_gemini_recorded_turn_approved() -> None:
    state = _open(gemini, GEMINI_ASK, "9396")
    assert gemini.map_message(GEMINI_PERMISSION, state) == []
    [ask] = state.asks
    assert (ask.tool, ask.command, ask.input) == ("execute", CMD, {"command": CMD})
    assert ask.description == CMD
    gemini.answer(state, ask, Decision(allow=True, always=True))
    # "always" is kept by the worker; the agent is told "once" (its own always is wider).
    assert _sent(state) == [
        {"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "selected", "optionId": "proceed_once"}}}
    ]  # fmt: skip
    done = _update(
        "9396",
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "run_shell_command__run_shell_command_1",
            "status": "completed",
            "title": CMD,
            "content": [],
            "locations": [],
            "kind": "execute",
        },
    )
    [activity] = gemini.map_message(done, state)
    assert (activity.kind, activity.description) == ("command", CMD)
    assert gemini.map_message(done, state) == []  # reported once
    text = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Done."}}
    assert _types(gemini.map_message(_update("9396", text), state)) == ["assistant-text"]
    result = {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {
            "stopReason": "end_turn",
            "_meta": {
                "quota": {
                    "token_count": {"input_tokens": 240, "output_tokens": 60},
                    "model_usage": [
                        {
                            "model": "gemini-2.5-flash",
                            "token_count": {"input_tokens": 240, "output_tokens": 60},
                        }
                    ],
                }
            },
        },
    }
    session, usage, complete = gemini.map_message(result, state)
    assert (session.session_id, session.resumed, session.model) == (
        "9396",
        False,
        "gemini-2.5-flash",
    )
    assert (usage.input_tokens, usage.output_tokens) == (240, 60)
    assert complete.type == "turn-complete" and complete.text == "Done."
    assert (complete.session_id, complete.input_tokens) == ("9396", 240)


def test_gemini_denied_and_aborted_answers() -> None:
    state = _open(gemini, GEMINI_ASK, "9396")
    gemini.map_message(GEMINI_PERMISSION, state)
    [ask] = state.asks
    gemini.answer(state, ask, Decision(allow=False, message="no"))
    [deny] = _sent(state)
    assert deny["result"] == {"outcome": {"outcome": "selected", "optionId": "cancel"}}
    gemini.answer(state, ask, Decision(allow=False, abort=True))
    cancelled, cancel = _sent(state)
    assert cancelled["result"] == {"outcome": {"outcome": "cancelled"}}
    assert cancel == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "9396"}}
    failed = _update(
        "9396",
        {"sessionUpdate": "tool_call_update", "toolCallId": "x", "status": "failed", "kind": "execute", "title": CMD},
    )  # fmt: skip
    [activity] = gemini.map_message(failed, state)
    assert activity.description == f"{CMD} (failed)"


def test_opencode_ask_config_and_recorded_denial() -> None:
    command = opencode.build_command(OPENCODE_ASK)
    assert command.argv == ("opencode", "acp") and command.keep_stdin
    config = json.loads(command.files["/workspace/.home/.config/opencode/opencode.json"])
    assert config["model"] == "harness/fake-model"
    assert config["permission"]["bash"] == "ask" and config["permission"]["edit"] == "ask"
    plain = opencode.build_command(TurnRequest(input="x", model="m", base_url="http://m/v1"))
    assert plain.argv[:2] == ("opencode", "run") and not plain.keep_stdin
    state = _open(opencode, OPENCODE_ASK, "ses_1")
    pending = _update(
        "ses_1",
        {"sessionUpdate": "tool_call", "toolCallId": "call_1", "title": "bash", "kind": "execute",
         "status": "pending", "locations": [{"path": WS}], "rawInput": {"cwd": WS}},
    )  # fmt: skip
    assert opencode.map_message(pending, state) == []
    permission = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "session/request_permission",
        "params": {
            "sessionId": "ses_1",
            "toolCall": {"toolCallId": "call_1", "title": CMD, "kind": "execute", "status": "pending",
                         "locations": [], "rawInput": {"command": CMD}},
            "options": [{"optionId": "once", "kind": "allow_once", "name": "Allow once"},
                        {"optionId": "always", "kind": "allow_always", "name": "Always allow"},
                        {"optionId": "reject", "kind": "reject_once", "name": "Reject"}],
        },
    }  # fmt: skip
    opencode.map_message(permission, state)
    [ask] = state.asks
    assert (ask.command, ask.input) == (CMD, {"command": CMD})
    opencode.answer(state, ask, Decision(allow=False, message="no"))
    assert _sent(state)[0]["result"] == {"outcome": {"outcome": "selected", "optionId": "reject"}}
    opencode.answer(state, ask, Decision(allow=True))
    assert _sent(state)[0]["result"] == {"outcome": {"outcome": "selected", "optionId": "once"}}
    failed = _update(
        "ses_1",
        {"sessionUpdate": "tool_call_update", "toolCallId": "call_1", "status": "failed",
         "kind": "execute", "title": CMD, "rawInput": {"command": CMD, "cwd": WS}},
    )  # fmt: skip
    [activity] = opencode.map_message(failed, state)
    assert (activity.kind, activity.description) == ("command", f"{CMD} (failed)")
    result = {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {
            "stopReason": "end_turn",
            "usage": {"inputTokens": 100, "outputTokens": 30, "totalTokens": 150, "cachedReadTokens": 20},
        },
    }  # fmt: skip
    _session, usage, complete = opencode.map_message(result, state)
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) == (100, 30, 20)
    assert complete.type == "turn-complete" and complete.session_id == "ses_1"


def test_load_skips_the_replayed_history_until_the_marker() -> None:
    request = TurnRequest(input="again", posture="ask", resume_session="ses_1", model="m")
    state = opencode.new_state(request)
    opencode.map_message({"jsonrpc": "2.0", "id": 1, "result": {}}, state)
    [load] = _sent(state)
    assert load["method"] == "session/load" and load["params"]["sessionId"] == "ses_1"
    opencode.map_message({"jsonrpc": "2.0", "id": 2, "result": {}}, state)
    [marker] = _sent(state)
    old = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "old"}}
    assert opencode.map_message(_update("ses_1", old), state) == []
    missing = {"jsonrpc": "2.0", "id": marker["id"], "error": {"code": -32601, "message": "x"}}
    opencode.map_message(missing, state)
    [prompt] = _sent(state)
    assert prompt["method"] == "session/prompt" and prompt["params"]["sessionId"] == "ses_1"
    new = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "new"}}
    assert _types(opencode.map_message(_update("ses_1", new), state)) == ["assistant-text"]
    session, complete = opencode.map_message(
        {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}}, state
    )
    assert session.resumed is True and complete.text == "new"


def test_failed_load_is_a_rejected_resume_and_errors_end_the_turn() -> None:
    request = TurnRequest(input="again", posture="ask", resume_session="stale")
    state = gemini.new_state(request)
    gemini.map_message({"jsonrpc": "2.0", "id": 1, "result": {}}, state)
    _sent(state)
    error = {
        "code": -32603,
        "message": "Internal error",
        "data": {"details": "No previous sessions"},
    }
    [event] = gemini.map_message({"jsonrpc": "2.0", "id": 2, "error": error}, state)
    assert event.type == "session-error" and state.resume_rejected
    assert "No previous sessions" in event.error
    state = _open(gemini, GEMINI_ASK, "s")
    failed = {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": -32603, "message": "429 Too Many Requests"},
    }
    events = gemini.map_message(failed, state)
    assert _types(events) == ["session", "session-error"] and events[-1].reason == "rate-limited"


def test_other_agent_requests_are_refused_at_once() -> None:
    state = _open(gemini, GEMINI_ASK, "s")
    read = {"jsonrpc": "2.0", "id": 7, "method": "fs/read_text_file", "params": {"path": "/x"}}
    assert gemini.map_message(read, state) == [] and not state.asks
    [refusal] = _sent(state)
    assert refusal["id"] == 7 and refusal["error"]["code"] == -32601
