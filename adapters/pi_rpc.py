"""pi with ``--posture ask``: ``pi --mode rpc`` (0.73.1) and a small extension shipped here.

pi has no permission system of its own. :data:`EXTENSION` (written into the run's HOME and
loaded with ``-e``) hooks ``tool_call``: for a gated tool (``HARNESS_ASK_TOOLS``: bash, edit
and write, less those the run allows outright) it calls ``ctx.ui.confirm``, which in RPC
mode is ``{"type":"extension_ui_request","id":I,"method":"confirm","title":
"harness-permission","message":<JSON of tool_name, tool_call_id, input>}`` on stdout,
waiting for ``{"type":"extension_ui_response","id":I,"confirmed":true|false}`` (or
``"cancelled":true``) on stdin. A denied call is blocked with a fixed reason the model is
told; without a UI (not RPC mode) every gated call is blocked, so the gate fails closed.

The options are pi's (:func:`adapters.pi.invocation`) with ``--mode rpc`` and ``-e``.
Stdin starts with ``get_state`` (its response names the session: RPC mode prints no
``session`` header) and the ``prompt`` command; the agent's events are those of
``--mode json`` and are mapped by :mod:`adapters.pi`. ``agent_end`` ends the turn, a failed
one too (RPC mode then waits for the next command, where ``-p`` would retry or exit). The
exit is read as in the one-shot mode (:func:`adapters.pi.finish`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from adapters import coerce, pi, pi_mcp
from adapters.asks import Ask, Decision
from adapters.errors import error_event
from adapters.events import Event
from adapters.protocol import AdapterState, Command, TurnRequest

HARNESS_ID = pi.HARNESS_ID
CAPABILITIES = pi.CAPABILITIES
TITLE = "harness-permission"
GATED = ("bash", "edit", "write")
"""The tools asked about; pi's others (read, grep, find, ls) only read."""
EXTENSION_PATH = ".pi/harness-ask-gate.ts"
"""Under the run's HOME."""

EXTENSION = """\
// harness-worker --posture ask: every call of a gated tool is asked of the worker.
export default function (pi: any) {
  const gated = new Set((process.env.HARNESS_ASK_TOOLS ?? "").split(",").filter(Boolean));
  const denied = "The tool call was denied by the operator of this run.";
  pi.on("tool_call", async (event: any, ctx: any) => {
    if (!gated.has(event.toolName)) return undefined;
    if (!ctx.hasUI) return { block: true, reason: "No approval channel: " + denied };
    const request = {
      tool_name: event.toolName,
      tool_call_id: event.toolCallId,
      input: event.input,
    };
    const ok = await ctx.ui.confirm("harness-permission", JSON.stringify(request));
    return ok ? undefined : { block: true, reason: denied };
  });
}
"""
_DIALOGS = frozenset({"confirm", "select", "input", "editor"})
"""extension_ui_request methods that wait for an answer (the others only notify)."""


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8") + b"\n"


@dataclass(kw_only=True)
class State(pi.State):
    """A ``pi --mode rpc`` turn: the one-shot mode's state, mapped partly here."""

    steers: int = 0
    """``steer`` commands sent this turn (each gets its own id)."""


def new_state(request: TurnRequest) -> State:
    # A model we describe ourselves (base_url) has no price: pi reports 0 for it.
    return State(offered_session=request.resume_session, priced=request.base_url is None)


def build_command(request: TurnRequest) -> Command:
    """The input rides in the RPC ``prompt`` command; stdin stays open for the answers."""
    argv, env, files = pi.invocation(request, ("--mode", "rpc"))
    path = f"{request.home.rstrip('/')}/{EXTENSION_PATH}"
    files[path] = EXTENSION
    argv += ["-e", path]
    asked = asked_tools(pi.tools_for(request), pi.allowed_outright(request))
    # The run's attached tools are asked like any other under --posture ask.
    env["HARNESS_ASK_TOOLS"] = ",".join([*filter(None, [asked]), *pi_mcp.tool_names(request)])
    prompt: dict[str, Any] = {"id": "harness-prompt", "type": "prompt", "message": request.input}
    images = [
        {"type": "image", "data": base64.b64encode(a.data).decode(), "mimeType": a.media_type}
        for a in request.attachments
        if a.image and a.data
    ]
    if images:  # 0.73.1's prompt command takes them as ImageContent beside the message
        prompt["images"] = images
    stdin = _line({"id": "harness-state", "type": "get_state"}) + _line(prompt)
    return Command(tuple(argv), stdin, env, files, request.workspace, keep_stdin=True)


def asked_tools(tools: list[str], allowed: set[str]) -> str:
    """``HARNESS_ASK_TOOLS``: the gated tools offered, less those allowed outright."""
    return ",".join(t for t in GATED if t in tools and t not in allowed)


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    """What only RPC mode sends, here; the agent's events by :func:`adapters.pi.map_message`."""
    kind = message.get("type")
    if kind == "agent_end" and state.failure is not None:
        # RPC mode waits for the next command after a failed reply: the turn ends here.
        return [*pi.session_events(state), pi.failed_event(state.failure)]
    if kind == "response":
        if message.get("command") == "steer":
            # 0.73.1 refuses a steer only for an extension command ("/name"): the turn goes on.
            return []
        if message.get("command") == "get_state" and message.get("success") is True:
            data = coerce.mapping(message.get("data"))
            state.session_id = coerce.nonempty(data.get("sessionId")) or state.session_id
        elif message.get("success") is False:
            detail = coerce.text(message.get("error")) or "pi refused the command"
            return [error_event(f"pi {message.get('command')}: {detail}")]
        return []
    if kind == "extension_ui_request":
        _ui_request(message, state)
        return []
    return pi.map_message(message, state)


def _ui_request(message: dict[str, Any], state: AdapterState) -> None:
    request_id = message.get("id")
    method = message.get("method")
    if not isinstance(request_id, str) or method not in _DIALOGS:
        return
    if method != "confirm" or message.get("title") != TITLE:
        # A dialog of no extension of ours: cancelled at once (it would wait forever).
        state.outbox.append(
            _line({"type": "extension_ui_response", "id": request_id, "cancelled": True})
        )
        return
    try:
        asked = coerce.mapping(json.loads(coerce.text(message.get("message"))))
    except ValueError:
        asked = {}
    tool = coerce.nonempty(asked.get("tool_name")) or "tool"
    value = asked.get("input")
    command = coerce.nonempty(coerce.mapping(value).get("command")) if tool == "bash" else None
    path = coerce.nonempty(coerce.mapping(value).get("path"))
    state.asks.append(
        Ask(
            native_id=request_id,
            tool=tool,
            input=value,
            description=command or (f"{tool} {path}" if path else tool),
            command=command,
        )
    )


def answer(state: AdapterState, ask: Ask, decision: Decision) -> None:
    reply: dict[str, Any] = {"type": "extension_ui_response", "id": ask.native_id}
    if decision.abort:
        reply["cancelled"] = True
    else:
        reply["confirmed"] = decision.allow
    state.outbox.append(_line(reply))


finish = pi.finish
policy_warning = pi.policy_warning


def steer(state: State, text: str) -> bool:
    """RPC mode's ``steer`` command: pi queues the message and hands it to the model after
    the running tool calls, before its next model request (after a final answer it makes
    one more), as a ``user`` message (docs/adapters.md, "Steering")."""
    state.steers += 1
    command = {"id": f"harness-steer-{state.steers}", "type": "steer", "message": text}
    state.outbox.append(_line(command))
    return True
