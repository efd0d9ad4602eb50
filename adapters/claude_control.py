"""claude-code with ``--posture ask``: the stdin control channel of ``claude -p
--input-format stream-json --permission-prompt-tool stdio`` (verified with 2.1.328).

The input goes on stdin as one stream-json ``user`` message and stdin stays open. Each tool
call the permission rules do not settle arrives on stdout as ``{"type":"control_request",
"request_id":R,"request":{"subtype":"can_use_tool","tool_name":T,"input":I,...}}`` and waits
for ``{"type":"control_response","response":{"subtype":"success","request_id":R,
"response":{"behavior":"allow","updatedInput":I}}}`` (or ``"behavior":"deny","message":M``)
on stdin. The channel fails closed: a closed stdin or an invalid answer is a denial. Once
the ``result`` line has come, stdin is closed and the CLI exits.

Everything else (the invocation, the other messages, the exit) is the one-shot mode's
(:mod:`adapters.claude_code`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from adapters import claude_code, coerce
from adapters.asks import Ask, Decision
from adapters.events import Event, TurnComplete, Usage
from adapters.protocol import AdapterState, Command, TurnRequest

HARNESS_ID = claude_code.HARNESS_ID
CAPABILITIES = claude_code.CAPABILITIES

ARGV = (
    "--input-format",
    "stream-json",
    "--permission-prompt-tool",
    "stdio",
    "--replay-user-messages",
)
"""Added to ``claude -p --output-format stream-json --verbose``; the permission mode is
``default``, so every call the rules do not settle is asked. ``--replay-user-messages``
echoes each ``user`` line of stdin (``isReplay``) once the CLI takes it: how a steer is
known to have reached the turn."""


@dataclass(kw_only=True)
class State(claude_code.State):
    """A turn with the control channel: the one-shot mode's state, mapped partly here."""

    steering: list[str] = field(default_factory=list)
    """Steer texts written and not yet echoed back (not yet taken by the CLI)."""
    held: Usage | None = None
    """What the ``result`` lines held back for a steer counted (their sum)."""


def new_state(request: TurnRequest) -> State:
    return State(offered_session=request.resume_session)


def build_command(request: TurnRequest) -> Command:
    permissions = [*ARGV, "--permission-mode", "default"]
    stdin = _first_message(request)
    return claude_code.command(request, permissions, stdin, keep_stdin=True)


def _first_message(request: TurnRequest) -> bytes:
    """The turn input as a stream-json ``user`` message line (its images beside it)."""
    return claude_code.user_message(request)


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    """A ``control_request`` here; the others by :func:`adapters.claude_code.map_message`."""
    kind = message.get("type")
    if kind == "control_request":
        _control_request(message, state, state.denied)
        return []
    if kind == "user" and message.get("isReplay") is True:
        _taken(message, state)
        return []
    if kind == "result":
        return _result(message, state)
    return claude_code.map_message(message, state)


def _control_request(message: dict[str, Any], state: AdapterState, asked: set[str]) -> None:
    """A permission request becomes an :class:`Ask`; anything else is refused at once (the
    CLI would wait for it forever)."""
    request_id = coerce.nonempty(message.get("request_id"))
    body = coerce.mapping(message.get("request"))
    if request_id is None:
        return
    if body.get("subtype") != "can_use_tool":
        _reply(state, {"subtype": "error", "request_id": request_id, "error": "not supported"})
        return
    tool = coerce.nonempty(body.get("tool_name")) or "tool"
    value = coerce.mapping(body.get("input"))
    command = coerce.nonempty(value.get("command")) if tool == "Bash" else None
    tool_use = coerce.nonempty(body.get("tool_use_id"))
    if tool_use:
        asked.add(tool_use)  # its denial in the result's permission_denials is already ours
    state.asks.append(
        Ask(
            native_id=request_id,
            tool=tool,
            input=value,
            description=coerce.nonempty(body.get("description"))
            or coerce.nonempty(body.get("display_name"))
            or tool,
            command=command,
            reply={"input": value},
        )
    )


def answer(state: AdapterState, ask: Ask, decision: Decision) -> None:
    if decision.allow:
        verdict: dict[str, Any] = {"behavior": "allow", "updatedInput": ask.reply["input"]}
    else:
        verdict = {"behavior": "deny", "message": decision.message or "denied"}
        if decision.abort:
            verdict["interrupt"] = True
    _reply(state, {"subtype": "success", "request_id": ask.native_id, "response": verdict})


def _reply(state: AdapterState, response: dict[str, Any]) -> None:
    line = {"type": "control_response", "response": response}
    state.outbox.append(json.dumps(line).encode("utf-8") + b"\n")


finish = claude_code.finish
policy_warning = claude_code.policy_warning


def steer(state: AdapterState, text: str) -> bool:
    """A stream-json ``user`` line on stdin. 2.1.328 hands it to the model in its next
    request of the turn (after the running tool calls) as a message saying the user sent it
    mid-turn; one that comes while the model writes its final answer is taken after the
    ``result`` as another round, whose ``result`` then ends our turn (docs/adapters.md,
    "Steering")."""
    if not isinstance(state, State):
        return False
    line = {
        "type": "user",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": None,
        "session_id": "",
    }
    state.outbox.append(json.dumps(line).encode("utf-8") + b"\n")
    state.steering.append(text)
    return True


def _taken(message: dict[str, Any], state: State) -> None:
    """A ``user`` line echoed back: the turn's input, or a steer the CLI has taken."""
    content = coerce.mapping(message.get("message")).get("content")
    if isinstance(content, str) and content in state.steering:
        state.steering.remove(content)


def _result(message: dict[str, Any], state: State) -> list[Event]:
    """A ``result`` ends the turn unless a steer is still waiting to be taken: the CLI then
    answers it in another round, and that round's ``result`` ends the turn, its counts the
    sum of both."""
    events = claude_code.map_message(message, state)
    if not events or not isinstance(events[-1], TurnComplete):
        return events
    done = events[-1]
    held = state.held
    if held is not None:
        done = done.model_copy(
            update={
                "input_tokens": (done.input_tokens or 0) + held.input_tokens,
                "output_tokens": (done.output_tokens or 0) + held.output_tokens,
                "cost_usd": None
                if done.cost_usd is None or held.cost_usd is None
                else done.cost_usd + held.cost_usd,
            }
        )
    if state.steering:
        state.held = Usage(
            input_tokens=done.input_tokens or 0,
            output_tokens=done.output_tokens or 0,
            cost_usd=done.cost_usd,
        )
        return events[:-1]
    return [*events[:-1], done]
