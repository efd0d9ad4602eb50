"""codex with ``--posture ask``: ``codex app-server`` (0.169.0), JSON-RPC over stdio
(:mod:`adapters.jsonrpc`), the one codex mode that asks (``codex exec`` never does).

The config file is codex's (:func:`adapters.codex.config_file`) with the sandbox mode of
the auto posture; model, thread and input ride in the requests, none in argv. The exit is
read as in the one-shot mode (:func:`adapters.codex.finish`). The turn:

1. → ``initialize`` ``{clientInfo}`` ← ``{userAgent, codexHome, ...}``; → ``initialized``.
2. → ``thread/start`` ``{cwd, model, approvalPolicy: "untrusted", sandbox}`` or
   ``thread/resume`` ``{threadId, ...}`` ← ``{thread: {id, ...}}``. A failed resume
   (``no rollout found for thread id ...``) is a stale session: ``resume_rejected``.
3. → ``turn/start`` ``{threadId, input: [{type: "text", text}, {type: "localImage", path}...],
   outputSchema}`` (images and schema when the turn has them) ← ``{turn: {id}}``.
   Notifications follow: ``item/started`` / ``item/completed`` (``commandExecution``,
   ``fileChange``, ``mcpToolCall``, ``webSearch``, ``agentMessage``), ``error``,
   ``thread/tokenUsage/updated`` (``last``: one model call; a resume first repeats the
   previous turn's, which is why usage is counted for this turn's id only), and the server
   → client requests ``item/commandExecution/requestApproval`` /
   ``item/fileChange/requestApproval``, answered ``{"decision": "accept" | "decline" |
   "cancel"}`` (the legacy ``execCommandApproval`` / ``applyPatchApproval``: ``approved`` /
   ``denied`` / ``abort``).
4. ← ``turn/completed`` ``{turn: {status, error}}`` ends the turn: ``completed`` is
   ``turn-complete``; ``interrupted`` (our ``cancel``) and ``failed`` are a
   ``session-error``.

A denial is ``decline``: the model is told ``rejected by user`` and the turn goes on (codex
has no message field). A turn that is ending (``abort``) answers ``cancel``, which
interrupts it. ``acceptForSession`` is never sent: a producer's "always" is kept by the
worker. Other server requests (``item/permissions/requestApproval``,
``item/tool/requestUserInput``, MCP elicitations) are refused with a JSON-RPC error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters import codex, coerce, jsonrpc
from adapters.asks import Ask, Decision
from adapters.errors import error_event
from adapters.events import (
    AssistantText,
    Event,
    SandboxActivity,
    Session,
    TurnComplete,
    Usage,
    session_error,
)
from adapters.protocol import AdapterState, Command, TurnRequest

HARNESS_ID = codex.HARNESS_ID
CAPABILITIES = codex.CAPABILITIES
SANDBOX_MODE = "danger-full-access"
"""codex asks before every command it does not know to be safe; what is approved runs as in
the auto posture, unsandboxed by codex (see :mod:`adapters.codex`)."""
APPROVAL_POLICY = "untrusted"
"""Every command codex does not know to be safe (reads such as ``ls``, ``cat``) is asked."""
_INITIALIZE, _THREAD, _TURN = 1, 2, 3
_STEER = 100
"""Request ids of ``turn/steer`` start above it (their responses are not waited for)."""
_APPROVALS = {
    "item/commandExecution/requestApproval": ("accept", "decline", "cancel"),
    "item/fileChange/requestApproval": ("accept", "decline", "cancel"),
    "execCommandApproval": ("approved", "denied", "abort"),
    "applyPatchApproval": ("approved", "denied", "abort"),
}


@dataclass
class Channel:
    """One turn's app-server conversation."""

    cwd: str
    input: str
    model: str | None
    sandbox: str
    resume: str | None
    images: tuple[str, ...] = ()
    """Absolute paths of the turn's images (``localImage`` inputs)."""
    output_schema: dict[str, Any] | None = None
    turn_id: str | None = None
    answer: str = ""
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)
    usage: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    announced: bool = False
    steers: int = 0
    completed: bool = False


@dataclass(kw_only=True)
class State(codex.State):
    channel: Channel


def new_state(request: TurnRequest) -> State:
    channel = Channel(
        cwd=request.workspace,
        input=request.input,
        model=request.model,
        sandbox=SANDBOX_MODE,
        resume=request.resume_session,
        images=tuple(f"{request.workspace}/{a.path}" for a in request.attachments if a.image),
        output_schema=dict(request.output_schema) if request.output_schema else None,
    )
    return State(
        offered_session=request.resume_session,
        prior=dict(request.carry),
        carry=dict(request.carry),
        channel=channel,
    )


def build_command(request: TurnRequest) -> Command:
    first = jsonrpc.request(
        _INITIALIZE, "initialize", {"clientInfo": {"name": "harness-worker", "version": "1"}}
    )
    return Command(
        argv=(request.executable or "codex", "app-server"),
        stdin=first,
        files=codex.config_file(request, SANDBOX_MODE),
        cwd=request.workspace,
        keep_stdin=True,
    )


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    ch = state.channel
    found = jsonrpc.kind(message)
    if found == "response":
        return _response(message, state, ch)
    if found == "request":
        _request(message, state, ch)
        return []
    if found == "notification":
        return _notification(message, state, ch)
    return []


def answer(state: State, ask: Ask, decision: Decision) -> None:
    accept, decline, cancel = _APPROVALS[ask.reply["method"]]
    verdict = cancel if decision.abort else accept if decision.allow else decline
    state.outbox.append(jsonrpc.result(ask.native_id, {"decision": verdict}))


finish = codex.finish


def policy_warning(request: TurnRequest) -> str | None:
    ask = (
        "codex runs the commands it was allowed to run outside its own sandbox in the ask "
        "posture (only the run's container confines them); commands it knows to be "
        "read-only (ls, cat, ...) run without asking"
    )
    rest = codex.policy_warning(request)
    return f"{ask}; {rest}" if rest else ask


# -- inside ----------------------------------------------------------------------------------


def _response(message: dict[str, Any], state: AdapterState, ch: Channel) -> list[Event]:
    request_id, failed = message.get("id"), "error" in message
    result = coerce.mapping(message.get("result"))
    if request_id == _INITIALIZE:
        if failed:
            return [error_event(f"codex app-server: {jsonrpc.error_text(message)}")]
        state.outbox.append(jsonrpc.notification("initialized"))
        params: dict[str, Any] = {
            "cwd": ch.cwd,
            "approvalPolicy": APPROVAL_POLICY,
            "sandbox": ch.sandbox,
        }
        if ch.model:
            params["model"] = ch.model
        if ch.resume:
            params["threadId"] = ch.resume
        method = "thread/resume" if ch.resume else "thread/start"
        state.outbox.append(jsonrpc.request(_THREAD, method, params))
        return []
    if request_id == _THREAD:
        if failed and ch.resume:
            state.resume_rejected = True
            detail = f"codex could not resume {ch.resume}: {jsonrpc.error_text(message)}"
            return [session_error(detail, "harness-error")]
        if failed:
            return [error_event(f"codex thread/start: {jsonrpc.error_text(message)}")]
        thread = coerce.mapping(result.get("thread"))
        state.session_id = coerce.nonempty(thread.get("id")) or ch.resume
        state.outbox.append(jsonrpc.request(_TURN, "turn/start", _turn_start(state.session_id, ch)))
        return []
    if request_id == _TURN:
        if failed:
            detail = jsonrpc.error_text(message)
            return [*_session(state, ch), error_event(f"codex turn/start: {detail}")]
        ch.turn_id = coerce.nonempty(coerce.mapping(result.get("turn")).get("id")) or ch.turn_id
    return []


def _turn_start(thread_id: str | None, ch: Channel) -> dict[str, Any]:
    """``turn/start``: the text, each image as a ``localImage``, and the output schema
    (0.169.0's ``TurnStartParams.outputSchema``, as ``codex exec --output-schema``)."""
    inputs: list[dict[str, Any]] = [{"type": "text", "text": ch.input}]
    inputs += [{"type": "localImage", "path": path} for path in ch.images]
    turn: dict[str, Any] = {"threadId": thread_id, "input": inputs}
    if ch.output_schema is not None:
        turn["outputSchema"] = ch.output_schema
    return turn


def _request(message: dict[str, Any], state: AdapterState, ch: Channel) -> None:
    method = coerce.text(message.get("method"))
    params = coerce.mapping(message.get("params"))
    if method not in _APPROVALS:
        state.outbox.append(jsonrpc.error(message["id"], jsonrpc.METHOD_NOT_FOUND, "not supported"))
        return
    item_id = coerce.text(params.get("itemId") or params.get("callId"))
    item = ch.items.get(item_id, {})
    command = params.get("command")
    if isinstance(command, list):  # the legacy request: argv
        command = " ".join(coerce.text(c) for c in command)
    command = coerce.nonempty(command) or coerce.nonempty(item.get("command"))
    value: dict[str, Any]
    if command is not None:
        tool, value = "shell", {"command": command, "cwd": coerce.text(params.get("cwd"))}
        description = coerce.nonempty(params.get("reason")) or command
    else:
        changes = item.get("changes") or params.get("fileChanges") or params.get("changes")
        tool, value = "apply_patch", {"changes": changes, "reason": params.get("reason")}
        description = coerce.nonempty(params.get("reason")) or _paths(item) or "file change"
    state.asks.append(
        Ask(
            native_id=message["id"],
            tool=tool,
            input=value,
            description=description,
            command=command,
            reply={"method": method},
        )
    )


def _paths(item: dict[str, Any]) -> str:
    changes = [coerce.mapping(c) for c in coerce.items(item.get("changes"))]
    return ", ".join(
        f"{coerce.text(coerce.mapping(c.get('kind')).get('type')) or 'update'} "
        f"{coerce.text(c.get('path'))}"
        for c in changes
    )


def _notification(message: dict[str, Any], state: AdapterState, ch: Channel) -> list[Event]:
    method = message.get("method")
    params = coerce.mapping(message.get("params"))
    if method in ("item/started", "item/completed"):
        item = coerce.mapping(params.get("item"))
        item_id = coerce.text(item.get("id"))
        ch.items[item_id] = item
        if method == "item/completed":
            return _item(item_id, item, state, ch)
        return []
    if method == "thread/tokenUsage/updated":
        if ch.turn_id is None or params.get("turnId") != ch.turn_id:
            return []  # a resume first repeats the previous turn's
        usage = coerce.mapping(params.get("tokenUsage"))
        last, total = coerce.mapping(usage.get("last")), coerce.mapping(usage.get("total"))
        for ours, theirs in (
            ("input_tokens", "inputTokens"),
            ("cached_input_tokens", "cachedInputTokens"),
            ("output_tokens", "outputTokens"),
        ):
            ch.usage[ours] = ch.usage.get(ours, 0) + coerce.count(last.get(theirs))
            ch.totals[ours] = coerce.count(total.get(theirs))
        return []
    if method == "turn/started":
        turn = coerce.mapping(params.get("turn"))
        ch.turn_id = ch.turn_id or coerce.nonempty(turn.get("id"))
        return []
    if method == "error":
        error = coerce.mapping(params.get("error"))
        ch.last_error = coerce.nonempty(error.get("message")) or ch.last_error
        return []
    if method == "turn/completed":
        return _completed(coerce.mapping(params.get("turn")), state, ch)
    return []


def _item(item_id: str, item: dict[str, Any], state: AdapterState, ch: Channel) -> list[Event]:
    kind = item.get("type")
    if kind == "agentMessage":
        text = coerce.nonempty(item.get("text"))
        if text is None:
            return []
        ch.answer = text
        return [*_session(state, ch), AssistantText(text=text)]
    if item_id in ch.reported:
        return []
    status = coerce.text(item.get("status"))
    suffix = f" ({status})" if status in ("failed", "declined") else ""
    if kind == "commandExecution":
        command = coerce.text(item.get("command"))
        activity = SandboxActivity(kind="command", description=command + suffix)
    elif kind == "fileChange":
        activity = SandboxActivity(
            kind="file", description=(_paths(item) or "file change") + suffix
        )
    elif kind == "mcpToolCall":
        name = ".".join(
            s for s in (coerce.nonempty(item.get("server")), coerce.nonempty(item.get("tool"))) if s
        )
        activity = SandboxActivity(kind="tool", description=(name or "mcp tool") + suffix)
    elif kind == "webSearch":
        activity = SandboxActivity(kind="tool", description=f"web_search {item.get('query', '')}")
    else:
        return []
    ch.reported.add(item_id)
    return [*_session(state, ch), activity]


def _session(state: AdapterState, ch: Channel) -> list[Event]:
    if ch.announced or state.session_id is None:
        return []
    ch.announced = True
    resumed = ch.resume is not None and state.session_id == ch.resume
    return [Session(session_id=state.session_id, resumed=resumed, model=None)]


def _completed(turn: dict[str, Any], state: AdapterState, ch: Channel) -> list[Event]:
    ch.completed = True
    out = _session(state, ch)
    usage = Usage(
        input_tokens=ch.usage.get("input_tokens", 0),
        output_tokens=ch.usage.get("output_tokens", 0),
        cached_input_tokens=ch.usage.get("cached_input_tokens", 0),
    )
    if ch.totals:  # what `codex exec` would count from, should a later turn use it
        state.carry = {"thread_id": state.session_id, **ch.totals}
    if usage.input_tokens or usage.output_tokens:
        out.append(usage)
    status = coerce.text(turn.get("status"))
    if status == "completed":
        complete = TurnComplete(
            text=ch.answer,
            session_id=state.session_id,
            model=None,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
        )
        return [*out, complete]
    error = coerce.mapping(turn.get("error"))
    detail = coerce.nonempty(error.get("message")) or ch.last_error
    if status == "interrupted":
        return [*out, session_error(detail or "codex interrupted the turn", "harness-error")]
    return [*out, error_event(detail or f"codex ended the turn: {status or 'no status'}")]


def steer(state: State, text: str) -> bool:
    """``turn/steer`` ``{threadId, expectedTurnId, input}`` into the running turn: codex adds
    the text to the turn as a user message (``item/started`` ``userMessage``) that its next
    model request carries, after the running tool calls (after a final answer it makes one
    more). Before the turn has its id, or once it has completed, there is no turn to steer
    (docs/adapters.md, "Steering")."""
    ch = state.channel
    if state.session_id is None or ch.turn_id is None or ch.completed:
        return False
    ch.steers += 1
    params = {
        "threadId": state.session_id,
        "expectedTurnId": ch.turn_id,
        "input": [{"type": "text", "text": text}],
    }
    state.outbox.append(jsonrpc.request(_STEER + ch.steers, "turn/steer", params))
    return True
