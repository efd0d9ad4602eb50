"""Each adapter's ``steer``: the line it writes on the harness's own channel (shapes recorded
from the real CLIs, docs/adapters.md "Steering"), and no channel where there is none."""

from __future__ import annotations

import json
from typing import Any

import pytest

import adapters
from adapters.events import TurnComplete, Usage
from adapters.protocol import TurnRequest

ASK = TurnRequest(input="go", posture="ask", model="fake-model", base_url="http://127.0.0.1:1")


def _lines(state: Any) -> list[dict[str, Any]]:
    lines = [json.loads(raw) for raw in state.outbox]
    state.outbox.clear()
    return lines


@pytest.mark.parametrize("harness_id", ["claude-code", "codex", "gemini", "opencode", "pi"])
def test_a_one_shot_turn_has_no_channel(harness_id: str) -> None:
    adapter = adapters.get(harness_id)
    state = adapter.new_state(TurnRequest(input="go", posture="auto"))
    assert adapter.steer(state, "look here") is False
    assert state.outbox == []


def test_the_steering_capability_says_which_ask_modes_take_a_steer() -> None:
    steering = {h: adapters.get(h).CAPABILITIES.steering for h in adapters.HARNESS_IDS}
    assert steering == {
        "claude-code": "ask-mode",
        "codex": "ask-mode",
        "gemini": "emulated",
        "opencode": "ask-mode",
        "pi": "ask-mode",
        "stdio-json": "ask-mode",
    }


def test_claude_code_writes_a_user_line_and_asks_for_its_echo() -> None:
    adapter = adapters.get("claude-code")
    assert "--replay-user-messages" in adapter.build_command(ASK).argv
    state = adapter.new_state(ASK)
    assert adapter.steer(state, "use the other file") is True
    assert _lines(state) == [
        {
            "type": "user",
            "message": {"role": "user", "content": "use the other file"},
            "parent_tool_use_id": None,
            "session_id": "",
        }
    ]


def _claude_result(cost: float) -> dict[str, Any]:
    # The shape of 2.1.328's result line (trimmed).
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "Hello from the fake model.",
        "session_id": "s-1",
        "usage": {"input_tokens": 100, "cache_read_input_tokens": 20, "output_tokens": 30},
        "model_usage_since_last_result": {"claude-opus-5-5": {"costUSD": cost}},
    }


def _claude_replay(text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "message": {"role": "user", "content": text},
        "session_id": "s-1",
        "parent_tool_use_id": None,
        "isReplay": True,
    }


def test_claude_code_holds_the_result_while_a_steer_waits_to_be_taken() -> None:
    adapter = adapters.get("claude-code")
    state = adapter.new_state(ASK)
    adapter.map_message(_claude_replay("go"), state)  # the turn's input, echoed
    adapter.steer(state, "and say bye")
    first = adapter.map_message(_claude_result(0.001), state)
    assert [e.type for e in first] == ["session", "usage"]
    adapter.map_message(_claude_replay("and say bye"), state)
    second = adapter.map_message(_claude_result(0.002), state)
    usage, done = second
    assert isinstance(usage, Usage) and usage.input_tokens == 120
    assert isinstance(done, TurnComplete)
    assert (done.input_tokens, done.output_tokens) == (240, 60)
    assert done.cost_usd == pytest.approx(0.003)


def test_claude_code_ends_at_the_result_once_the_steer_was_taken_mid_turn() -> None:
    adapter = adapters.get("claude-code")
    state = adapter.new_state(ASK)
    adapter.steer(state, "and say bye")
    adapter.map_message(_claude_replay("and say bye"), state)
    events = adapter.map_message(_claude_result(0.001), state)
    assert isinstance(events[-1], TurnComplete) and events[-1].input_tokens == 120


def _codex_running(adapter: Any) -> Any:
    state = adapter.new_state(ASK)
    adapter.map_message({"id": 1, "result": {"userAgent": "codex"}}, state)
    adapter.map_message({"id": 2, "result": {"thread": {"id": "thread-1"}}}, state)
    return state


def test_codex_steers_the_running_turn_by_its_id() -> None:
    adapter = adapters.get("codex")
    state = _codex_running(adapter)
    state.outbox.clear()
    assert adapter.steer(state, "too early") is False  # the turn has no id yet
    adapter.map_message({"id": 3, "result": {"turn": {"id": "turn-1"}}}, state)
    assert adapter.steer(state, "use the other file") is True
    assert adapter.steer(state, "and say bye") is True
    first, second = _lines(state)
    assert first == {
        "jsonrpc": "2.0",
        "id": 101,
        "method": "turn/steer",
        "params": {
            "threadId": "thread-1",
            "expectedTurnId": "turn-1",
            "input": [{"type": "text", "text": "use the other file"}],
        },
    }
    assert second["id"] == 102
    # A refused steer (say, the turn ended meanwhile) does not end the turn.
    refused = {"id": 101, "error": {"code": -32600, "message": "no active turn"}}
    assert adapter.map_message(refused, state) == []
    completed = {"turn": {"id": "turn-1", "status": "completed"}}
    adapter.map_message({"method": "turn/completed", "params": completed}, state)
    assert adapter.steer(state, "too late") is False


def test_pi_sends_the_rpc_steer_command() -> None:
    adapter = adapters.get("pi")
    state = adapter.new_state(ASK)
    assert adapter.steer(state, "use the other file") is True
    assert adapter.steer(state, "and say bye") is True
    assert _lines(state) == [
        {"id": "harness-steer-1", "type": "steer", "message": "use the other file"},
        {"id": "harness-steer-2", "type": "steer", "message": "and say bye"},
    ]
    refused = {"type": "response", "command": "steer", "success": False, "error": "no"}
    assert adapter.map_message(refused, state) == []


def _acp_prompting(adapter: Any) -> Any:
    state = adapter.new_state(ASK)
    assert adapter.steer(state, "too early") is False  # no session, no prompt yet
    adapter.map_message({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 1}}, state)
    adapter.map_message({"jsonrpc": "2.0", "id": 2, "result": {"sessionId": "ses_1"}}, state)
    state.outbox.clear()
    return state


def test_opencode_sends_a_second_session_prompt() -> None:
    adapter = adapters.get("opencode")
    state = _acp_prompting(adapter)
    assert adapter.steer(state, "use the other file") is True
    assert _lines(state) == [
        {
            "jsonrpc": "2.0",
            "id": 101,
            "method": "session/prompt",
            "params": {
                "sessionId": "ses_1",
                "prompt": [{"type": "text", "text": "use the other file"}],
            },
        }
    ]
    end = {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}}
    adapter.map_message(end, state)
    assert adapter.steer(state, "too late") is False


def test_opencode_answer_is_the_last_assistant_message_after_a_steer() -> None:
    adapter = adapters.get("opencode")
    state = _acp_prompting(adapter)

    def chunk(message_id: str, text: str) -> dict[str, Any]:
        update = {
            "sessionUpdate": "agent_message_chunk",
            "messageId": message_id,
            "content": {"type": "text", "text": text},
        }
        return {"jsonrpc": "2.0", "method": "session/update", "params": {"update": update}}

    for message in (chunk("msg_1", "Hello "), chunk("msg_1", "there."), chunk("msg_2", "Bye.")):
        adapter.map_message(message, state)
    [*_, done] = adapter.map_message(
        {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}}, state
    )
    assert isinstance(done, TurnComplete) and done.text == "Bye."


def test_gemini_has_no_channel_in_its_ask_mode_either() -> None:
    adapter = adapters.get("gemini")
    state = _acp_prompting(adapter)
    assert adapter.steer(state, "use the other file") is False
    assert state.outbox == []
