"""The Agent Client Protocol (ACP) client both ``gemini --acp`` (0.61.0) and ``opencode acp``
(1.18.33) speak with ``--posture ask``: one JSON-RPC mapper, pure like every adapter.

The turn, over the harness's stdin/stdout (newline-delimited JSON-RPC 2.0, see
:mod:`adapters.jsonrpc`):

1. → ``initialize`` (``protocolVersion`` 1; no ``fs``/``terminal`` client capabilities, so
   the agent reads, writes and runs commands itself) ← its capabilities.
2. → ``session/new`` ``{cwd, mcpServers: []}``, or ``session/load`` ``{sessionId, cwd,
   mcpServers}`` to resume (both CLIs advertise ``loadSession``) ← ``sessionId``. The
   history the agent replays is not this turn's and is skipped: gemini streams it on after
   the load's response, so a request for a method no agent has (``harness/replayed``) is
   sent after the load, and its (error) response marks where the replay ends. A failed load
   means a stale session: ``resume_rejected``, and the worker retries fresh with the run's
   prior conversation replayed.
3. → ``session/prompt`` with the turn's images (``image`` blocks) and the input as one text
   block. While it runs, ``session/update`` notifications carry ``agent_message_chunk``
   (assistant text), ``tool_call`` / ``tool_call_update`` (reported as ``sandbox-activity``
   once a call completes or fails) and ``usage_update``; the agent → client request
   ``session/request_permission`` ``{toolCall, options: [{optionId, kind}]}`` becomes an
   :class:`~adapters.asks.Ask`.
4. ← the prompt's response ends the turn: ``{"stopReason": ...}`` (``end_turn``,
   ``max_tokens``, ``max_turn_requests``, ``refusal``) is ``turn-complete`` with the usage
   it carries (opencode: ``usage``; gemini: ``_meta.quota``); ``cancelled`` or an error
   response is a ``session-error``.

A permission is answered by option **kind**, never by id (the ids differ: gemini
``proceed_once``/``cancel``, opencode ``once``/``reject``): allow → ``allow_once``; deny →
``reject_once``; a turn that is ending (``abort``) → ``{"outcome": "cancelled"}`` and a
``session/cancel`` notification. ``allow_always`` is never chosen: its reach is the
agent's (a whole command prefix or tool for the session) and wider than ours, so a
producer's "always" is applied by the worker (the same tool and input are allowed without
asking) and the agent is told "once". ACP carries no message with a denial: the model is
told the agent's own words ("... was canceled by the user", "The user rejected
permission ...").
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from adapters import coerce, jsonrpc
from adapters.asks import Ask, Decision
from adapters.errors import error_event
from adapters.events import (
    ActivityKind,
    AssistantText,
    Event,
    SandboxActivity,
    Session,
    TurnComplete,
    Usage,
    session_error,
)
from adapters.protocol import AdapterState, TurnRequest

PROTOCOL_VERSION = 1
_INITIALIZE, _SESSION, _PROMPT, _REPLAYED = 1, 2, 3, 4
_STEER = 100
"""Request ids of a steer's ``session/prompt`` start above it (:func:`steer`)."""
_MARKER = "harness/replayed"
"""A method no agent has: its error response comes back after the history ``session/load``
replays (gemini 0.61.0 streams it on after the load's response), marking where it ends."""
_COMPLETE = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal"})
_DONE = frozenset({"completed", "failed"})
_FILE_KINDS = frozenset({"edit", "delete", "move"})


@dataclass
class Tool:
    kind: str = ""
    title: str = ""
    raw_input: dict[str, Any] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    reported: bool = False


@dataclass
class Client:
    """One turn's ACP conversation: where it stands and what it has seen."""

    cwd: str
    input: str
    resume: str | None
    images: tuple[dict[str, str], ...] = ()
    """The turn's images as ACP ``image`` content blocks (``mimeType``, base64 ``data``)."""
    phase: str = "initializing"
    """initializing → opening (session/new or load) → [replaying] → prompting → done."""
    texts: list[str] = field(default_factory=list)
    tools: dict[str, Tool] = field(default_factory=dict)
    announced: bool = False
    steers: int = 0
    message_id: str | None = None
    """The ``messageId`` of the last ``agent_message_chunk`` (opencode sends one)."""


def client(request: TurnRequest) -> Client:
    images = tuple(
        {"type": "image", "mimeType": a.media_type, "data": base64.b64encode(a.data).decode()}
        for a in request.attachments
        if a.image and a.data
    )
    return Client(
        cwd=request.workspace, input=request.input, resume=request.resume_session, images=images
    )


def first_message() -> bytes:
    """What the command's stdin starts with: ``initialize``."""
    return jsonrpc.request(
        _INITIALIZE,
        "initialize",
        {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": False, "writeTextFile": False},
                "terminal": False,
            },
        },
    )


def map_message(message: dict[str, Any], state: AdapterState, acp: Client) -> list[Event]:
    """Map one message of the agent; replies it needs go to ``state.outbox``."""
    found = jsonrpc.kind(message)
    if found == "response":
        return _response(message, state, acp)
    if found == "request":
        _request(message, state, acp)
        return []
    if found == "notification" and message.get("method") == "session/update":
        if acp.phase != "prompting":
            return []  # the history replayed by session/load, or nothing of ours yet
        params = coerce.mapping(message.get("params"))
        return _update(coerce.mapping(params.get("update")), acp)
    return []


def answer(state: AdapterState, ask: Ask, decision: Decision) -> None:
    options: dict[str, str] = ask.reply.get("options", {})
    if decision.abort:
        outcome: dict[str, Any] = {"outcome": "cancelled"}
    else:
        wanted = ("allow_once", "allow_always") if decision.allow else ("reject_once",)
        chosen = next((options[k] for k in wanted if k in options), None)
        if chosen is None and not decision.allow:
            chosen = options.get("reject_always")
        # No option of the kind we need: a cancelled prompt denies the call (fails closed).
        outcome = (
            {"outcome": "selected", "optionId": chosen} if chosen else {"outcome": "cancelled"}
        )
    state.outbox.append(jsonrpc.result(ask.native_id, {"outcome": outcome}))
    session = ask.reply.get("session")
    if decision.abort and session:
        state.outbox.append(jsonrpc.notification("session/cancel", {"sessionId": session}))


# -- inside ----------------------------------------------------------------------------------


def _response(message: dict[str, Any], state: AdapterState, acp: Client) -> list[Event]:
    request_id = message.get("id")
    failed = "error" in message
    if request_id == _INITIALIZE:
        if failed:
            return [_error("initialize", message, acp)]
        acp.phase = "opening"
        params: dict[str, Any] = {"cwd": acp.cwd, "mcpServers": []}
        if acp.resume:
            params["sessionId"] = acp.resume
        method = "session/load" if acp.resume else "session/new"
        state.outbox.append(jsonrpc.request(_SESSION, method, params))
        return []
    if request_id == _SESSION:
        if failed and acp.resume:
            # A session the agent does not know (or cannot load): the worker retries fresh.
            state.resume_rejected = True
            acp.phase = "done"
            detail = f"could not resume session {acp.resume}: {jsonrpc.error_text(message)}"
            return [session_error(detail, "harness-error")]
        if failed:
            return [_error("session/new", message, acp)]
        result = coerce.mapping(message.get("result"))
        state.session_id = coerce.nonempty(result.get("sessionId")) or acp.resume
        if acp.resume:
            acp.phase = "replaying"
            state.outbox.append(jsonrpc.request(_REPLAYED, _MARKER, {}))
            return []
        return _prompt(state, acp)
    if request_id == _REPLAYED:
        return _prompt(state, acp)
    if request_id == _PROMPT:
        acp.phase = "done"
        if failed:
            return [*_session(state, acp), _error("session/prompt", message, acp)]
        return _stopped(coerce.mapping(message.get("result")), state, acp)
    return []


def steer(state: AdapterState, acp: Client, text: str) -> bool:
    """A second ``session/prompt`` with the text while the turn's prompt runs. What it does
    is the agent's: opencode 1.18.33 queues it into the running prompt (the next model
    request carries it; both prompts' responses come at the end), gemini 0.61.0 cancels the
    running prompt instead, so only opencode's adapter calls this (docs/adapters.md,
    "Steering"). Before the prompt is sent, or once it has answered, there is none to
    steer."""
    if acp.phase != "prompting" or state.session_id is None:
        return False
    acp.steers += 1
    prompt = {"sessionId": state.session_id, "prompt": [{"type": "text", "text": text}]}
    state.outbox.append(jsonrpc.request(_STEER + acp.steers, "session/prompt", prompt))
    return True


def _prompt(state: AdapterState, acp: Client) -> list[Event]:
    acp.phase = "prompting"
    prompt = {
        "sessionId": state.session_id,
        "prompt": [*acp.images, {"type": "text", "text": acp.input}],
    }
    state.outbox.append(jsonrpc.request(_PROMPT, "session/prompt", prompt))
    return []


def _error(method: str, message: dict[str, Any], acp: Client) -> Event:
    acp.phase = "done"
    return error_event(f"ACP {method} failed: {jsonrpc.error_text(message)}")


def _request(message: dict[str, Any], state: AdapterState, acp: Client) -> None:
    request_id = message["id"]
    params = coerce.mapping(message.get("params"))
    if message.get("method") != "session/request_permission":
        # We offered no fs or terminal capability: anything else is refused at once (the
        # agent would otherwise wait for it forever).
        state.outbox.append(jsonrpc.error(request_id, jsonrpc.METHOD_NOT_FOUND, "not supported"))
        return
    call = coerce.mapping(params.get("toolCall"))
    call_id = coerce.text(call.get("toolCallId"))
    tool = _track(call_id, call, acp)
    options = {}
    for option in coerce.items(params.get("options")):
        option = coerce.mapping(option)
        kind, option_id = coerce.nonempty(option.get("kind")), option.get("optionId")
        if kind and isinstance(option_id, str) and kind not in options:
            options[kind] = option_id
    command = _command(tool)
    value: Any = tool.raw_input or (
        {"command": command} if command else {"title": tool.title, "paths": tool.paths}
    )
    text = " ".join(
        coerce.text(coerce.mapping(c.get("content")).get("text"))
        for c in map(coerce.mapping, coerce.items(call.get("content")))
    ).strip()
    state.asks.append(
        Ask(
            native_id=request_id,
            tool=tool.kind or "tool",
            input=value,
            description=tool.title or text or tool.kind or "tool call",
            command=command,
            reply={"options": options, "session": params.get("sessionId") or state.session_id},
        )
    )


def _track(call_id: str, update: dict[str, Any], acp: Client) -> Tool:
    tool = acp.tools.setdefault(call_id, Tool())
    tool.kind = coerce.nonempty(update.get("kind")) or tool.kind
    tool.title = coerce.nonempty(update.get("title")) or tool.title
    raw = update.get("rawInput")
    if isinstance(raw, dict) and raw:
        tool.raw_input = {k: v for k, v in raw.items() if k != "cwd"} or tool.raw_input
    paths = [
        coerce.text(coerce.mapping(loc).get("path"))
        for loc in coerce.items(update.get("locations"))
    ]
    tool.paths = [p for p in paths if p] or tool.paths
    return tool


def _command(tool: Tool) -> str | None:
    if tool.kind != "execute":
        return None
    return coerce.nonempty(tool.raw_input.get("command")) or coerce.nonempty(tool.title)


def _update(update: dict[str, Any], acp: Client) -> list[Event]:
    kind = update.get("sessionUpdate")
    if kind == "agent_message_chunk":
        content = coerce.mapping(update.get("content"))
        text = coerce.nonempty(content.get("text")) if content.get("type") == "text" else None
        if text is None:
            return []
        message_id = coerce.nonempty(update.get("messageId"))
        if message_id is not None and message_id != acp.message_id:
            # A new assistant message (after a steer, with no tool call between): the final
            # answer is the last one, not all of them run together.
            if acp.message_id is not None:
                acp.texts.clear()
            acp.message_id = message_id
        acp.texts.append(text)
        return [AssistantText(text=text)]
    if kind in ("tool_call", "tool_call_update"):
        call_id = coerce.text(update.get("toolCallId"))
        tool = _track(call_id, update, acp)
        acp.texts.clear()  # the final answer is what follows the last tool call
        status = update.get("status")
        if status not in _DONE or tool.reported:
            return []
        tool.reported = True
        return [_activity(tool, failed=status == "failed")]
    return []


def _activity(tool: Tool, *, failed: bool) -> SandboxActivity:
    activity: ActivityKind = "tool"
    description = tool.title or tool.kind or "tool"
    command = _command(tool)
    if command:
        activity, description = "command", command
    elif tool.kind in _FILE_KINDS:
        path = ", ".join(tool.paths) or tool.title
        activity, description = "file", f"{tool.kind} {path}".strip()
    return SandboxActivity(kind=activity, description=description + (" (failed)" if failed else ""))


def _session(state: AdapterState, acp: Client) -> list[Event]:
    if acp.announced or state.session_id is None:
        return []
    acp.announced = True
    resumed = acp.resume is not None and state.session_id == acp.resume
    return [Session(session_id=state.session_id, resumed=resumed, model=state.model)]


def _usage(result: dict[str, Any], state: AdapterState) -> Usage:
    usage = coerce.mapping(result.get("usage"))  # opencode 1.18.33 (ACP's draft PromptUsage)
    if usage:
        cached = coerce.count(usage.get("cachedReadTokens"))
        return Usage(
            input_tokens=coerce.count(usage.get("inputTokens")),
            output_tokens=coerce.count(usage.get("outputTokens"))
            + coerce.count(usage.get("thoughtTokens")),
            cached_input_tokens=cached,
        )
    quota = coerce.mapping(coerce.mapping(result.get("_meta")).get("quota"))  # gemini 0.61.0
    tokens = coerce.mapping(quota.get("token_count"))
    models = [coerce.mapping(m) for m in coerce.items(quota.get("model_usage"))]
    spent = {
        coerce.text(m.get("model")): sum(
            coerce.count(v) for v in coerce.mapping(m.get("token_count")).values()
        )
        for m in models
        if coerce.nonempty(m.get("model"))
    }
    if spent:
        state.model = max(spent, key=lambda k: spent[k])
    return Usage(
        input_tokens=coerce.count(tokens.get("input_tokens")),
        output_tokens=coerce.count(tokens.get("output_tokens")),
    )


def _stopped(result: dict[str, Any], state: AdapterState, acp: Client) -> list[Event]:
    usage = _usage(result, state)
    out = _session(state, acp)
    if usage.input_tokens or usage.output_tokens:
        out.append(usage)
    reason = coerce.text(result.get("stopReason"))
    if reason not in _COMPLETE:
        detail = f"the agent stopped the prompt: {reason or 'no stop reason'}"
        return [*out, session_error(detail, "harness-error")]
    complete = TurnComplete(
        text="".join(acp.texts),
        session_id=state.session_id,
        model=state.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
    )
    return [*out, complete]
