"""codex ``--posture ask``: ``codex app-server`` JSON-RPC, mapped from messages recorded with
0.169.0 against the fake model's ``edit`` scenario."""

from __future__ import annotations

import json
from typing import Any

import adapters
from adapters.asks import Decision
from adapters.protocol import TurnRequest

codex = adapters.get("codex")

ASK = TurnRequest(input="[scenario:edit] go", posture="ask", model="gpt-5.5")
THREAD = "01a22f1a-273c"
TURN = "01a22f1a-274d"
CMD = "/bin/bash -lc 'echo made-by-agent > agent.txt'"


def _sent(state: Any) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in state.outbox]
    state.outbox.clear()
    return lines


def _note(method: str, **params: Any) -> dict[str, Any]:
    return {"method": method, "params": {"threadId": THREAD, **params}}


def _started(request: TurnRequest = ASK) -> Any:
    state = codex.new_state(request)
    codex.map_message({"id": 1, "result": {"userAgent": "x", "platformOs": "linux"}}, state)
    initialized, thread = _sent(state)
    assert initialized == {"jsonrpc": "2.0", "method": "initialized"}
    assert thread["params"]["approvalPolicy"] == "untrusted"
    assert thread["params"]["model"] == "gpt-5.5"
    codex.map_message({"id": 2, "result": {"thread": {"id": THREAD}}}, state)
    [turn] = _sent(state)
    assert turn["method"] == "turn/start"
    assert turn["params"] == {"threadId": THREAD, "input": [{"type": "text", "text": ASK.input}]}
    codex.map_message({"id": 3, "result": {"turn": {"id": TURN, "status": "inProgress"}}}, state)
    return state


def _approval() -> dict[str, Any]:
    return {
        "method": "item/commandExecution/requestApproval",
        "id": 0,
        "params": {
            "kind": "command",
            "threadId": THREAD,
            "turnId": TURN,
            "itemId": "call_1",
            "command": CMD,
            "cwd": "/workspace",
            "availableDecisions": ["accept", "cancel"],
        },
    }


def _command_item(status: str) -> dict[str, Any]:
    item = {"type": "commandExecution", "id": "call_1", "command": CMD, "status": status}
    return _note("item/completed", turnId=TURN, item=item)


def _usage(turn: str, last: int) -> dict[str, Any]:
    counts = {"inputTokens": last, "cachedInputTokens": 20, "outputTokens": 30}
    return _note(
        "thread/tokenUsage/updated", turnId=turn, tokenUsage={"total": counts, "last": counts}
    )


def test_ask_runs_app_server_and_the_other_postures_do_not() -> None:
    command = codex.build_command(ASK)
    assert command.argv == ("codex", "app-server") and command.keep_stdin
    assert json.loads(command.stdin or b"")["method"] == "initialize"
    assert "/workspace/.home/.codex/config.toml" in command.files
    plain = codex.build_command(TurnRequest(input="x", posture="auto"))
    assert plain.argv[:2] == ("codex", "exec") and not plain.keep_stdin
    assert "ask posture" in (codex.policy_warning(ASK) or "")


def test_approved_command_and_a_completed_turn() -> None:
    state = _started()
    # A resume first repeats the previous turn's usage: not this turn's.
    assert codex.map_message(_usage("older-turn", 999), state) == []
    assert codex.map_message(_approval(), state) == []
    [ask] = state.asks
    assert (ask.tool, ask.command, ask.input["command"]) == ("shell", CMD, CMD)
    codex.answer(state, ask, Decision(allow=True, always=True))
    assert _sent(state) == [{"jsonrpc": "2.0", "id": 0, "result": {"decision": "accept"}}]
    [session, activity] = codex.map_message(_command_item("completed"), state)
    assert (session.session_id, session.resumed) == (THREAD, False)
    assert (activity.kind, activity.description) == ("command", CMD)
    codex.map_message(_usage(TURN, 120), state)
    codex.map_message(_usage(TURN, 120), state)
    message = {"type": "agentMessage", "id": "msg_1", "text": "Done."}
    [text] = codex.map_message(_note("item/completed", turnId=TURN, item=message), state)
    assert text.type == "assistant-text"
    end = _note("turn/completed", turn={"id": TURN, "status": "completed", "error": None})
    usage, complete = codex.map_message(end, state)
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (240, 40, 60)
    assert complete.type == "turn-complete" and complete.text == "Done."
    assert complete.session_id == THREAD and state.carry["thread_id"] == THREAD


def test_declined_and_cancelled_answers() -> None:
    state = _started()
    codex.map_message(_approval(), state)
    [ask] = state.asks
    codex.answer(state, ask, Decision(allow=False, message="no"))
    codex.answer(state, ask, Decision(allow=False, abort=True))
    assert [m["result"]["decision"] for m in _sent(state)] == ["decline", "cancel"]
    [_session, activity] = codex.map_message(_command_item("declined"), state)
    assert activity.description == f"{CMD} (declined)"
    end = _note("turn/completed", turn={"id": TURN, "status": "interrupted", "error": None})
    [error] = codex.map_message(end, state)
    assert error.type == "session-error" and error.reason == "harness-error"


def test_legacy_and_file_change_approvals() -> None:
    state = _started()
    legacy = {
        "method": "execCommandApproval",
        "id": 5,
        "params": {"callId": "c", "command": ["ls", "-la"]},
    }
    codex.map_message(legacy, state)
    item = {
        "type": "fileChange",
        "id": "fc",
        "changes": [{"path": "a.txt", "kind": {"type": "add"}}],
    }
    codex.map_message(_note("item/started", turnId=TURN, item=item), state)
    patch = {"method": "item/fileChange/requestApproval", "id": 6, "params": {"itemId": "fc"}}
    codex.map_message(patch, state)
    old, change = state.asks
    assert old.command == "ls -la" and change.tool == "apply_patch" and change.command is None
    assert change.description == "add a.txt"
    codex.answer(state, old, Decision(allow=False))
    codex.answer(state, change, Decision(allow=True))
    assert [m["result"]["decision"] for m in _sent(state)] == ["denied", "accept"]
    other = {"method": "item/tool/requestUserInput", "id": 7, "params": {}}
    codex.map_message(other, state)
    assert _sent(state)[0]["error"]["code"] == -32601 and len(state.asks) == 2


def test_stale_thread_and_failed_turn() -> None:
    state = codex.new_state(TurnRequest(input="x", posture="ask", resume_session="stale"))
    codex.map_message({"id": 1, "result": {}}, state)
    [_init, resume] = _sent(state)
    assert resume["method"] == "thread/resume" and resume["params"]["threadId"] == "stale"
    error = {"code": -32600, "message": "no rollout found for thread id stale"}
    [event] = codex.map_message({"id": 2, "error": error}, state)
    assert event.type == "session-error" and state.resume_rejected
    state = _started()
    codex.map_message(
        _note("error", error={"message": "unexpected status 401 Unauthorized"}), state
    )
    end = _note("turn/completed", turn={"id": TURN, "status": "failed", "error": None})
    _session, failed = codex.map_message(end, state)
    assert failed.type == "session-error" and failed.reason == "auth"
