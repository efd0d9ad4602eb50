"""stdio-json: the generic newline-JSON protocol for custom harnesses (docs/events.md,
"Writing a harness: the `stdio-json` protocol").

The input goes on stdin, then stdin is closed. ``HARNESS_TURN`` and, when a session should
be continued, ``HARNESS_RESUME_SESSION`` are set in the environment;
``HARNESS_MODEL_BASE_URL`` is where it sends model requests (the turn's model gateway, whose
stand-in key it holds). When the run attached
tools (``--tools``, ``--mcp``), ``HARNESS_MCP_CONFIG`` names a file in the common
``{"mcpServers": {NAME: {"command", "args", "env"}}}`` shape: each a stdio MCP server the
harness launches with its own environment (which holds the run's credential).

With ``--posture ask`` (``HARNESS_POSTURE=ask`` in the environment) stdin stays open for the
turn: its first line is ``{"type":"input","text":T}``, and every ``permission`` line the
harness writes is answered by a line ``{"type":"decision","id":I,"decision":"allow"|"deny",
"message":M}`` (``scope`` ``always`` when allowed for the rest of the run; ``abort`` true
when the turn is ending). Stdin is closed once the turn has its terminal line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from adapters import coerce, mcp_config
from adapters.asks import Ask, Decision
from adapters.events import (
    AssistantText,
    Event,
    PermissionRequest,
    SandboxActivity,
    Session,
    TurnComplete,
    Usage,
    session_error,
)
from adapters.protocol import AdapterState, Capabilities, Command, ExitInfo, TurnRequest

HARNESS_ID = "stdio-json"

CAPABILITIES = Capabilities(
    session_resume=True,
    system_prompt=False,
    permission_policy="none",
    permission_hooks=False,
    mid_turn_cancel=True,
    usage_reporting=True,
    cost_reporting=True,
    model_selection=False,
    model_reporting=True,
    mcp_client=True,
    permission_ask=True,
    attachments="files",
    steering="ask-mode",
)

_ACTIVITY_KINDS = {"command", "file", "tool", "other"}


@dataclass
class State(AdapterState):
    offered_session: str | None
    ask: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


def new_state(request: TurnRequest) -> State:
    return State(offered_session=request.resume_session, ask=request.posture == "ask")


def build_command(request: TurnRequest) -> Command:
    if not request.executable:
        raise ValueError("the stdio-json harness needs an executable (--executable PATH)")
    env = {"HARNESS_TURN": str(request.turn)}
    if request.attachments:
        env["HARNESS_ATTACHMENTS"] = attachments_env(request)
    if request.resume_session:
        env["HARNESS_RESUME_SESSION"] = request.resume_session
    if request.base_url:
        # The model gateway's loopback URL (or the producer's --base-url where no model key
        # is routed): where a harness sends model requests, with its granted key's stand-in.
        env["HARNESS_MODEL_BASE_URL"] = request.base_url
    # No system-prompt channel in this protocol (capability system_prompt is false): the
    # worker puts a system prompt into the input before the request gets here.
    files = {}
    if request.mcp_servers:
        path = f"{request.home}/{mcp_config.COMMON_FILE}"
        files[path] = mcp_config.common_json(request.mcp_servers)
        env["HARNESS_MCP_CONFIG"] = path
    if request.posture == "ask":
        env["HARNESS_POSTURE"] = "ask"
        first = json.dumps({"type": "input", "text": request.input}) + "\n"
        return Command(
            argv=(request.executable,),
            stdin=first.encode("utf-8"),
            env=env,
            files=files,
            cwd=request.workspace,
            keep_stdin=True,
        )
    return Command(
        argv=(request.executable,),
        stdin=request.input.encode("utf-8"),
        env=env,
        files=files,
        cwd=request.workspace,
    )


def attachments_env(request: TurnRequest) -> str:
    """``HARNESS_ATTACHMENTS``: the turn's files as a JSON list of ``{"path", "media_type",
    "size"}``, each path absolute (at most HARNESS_ATTACH_MAX_FILES entries, so the variable
    stays small; the bytes are in the files)."""
    files = [
        {"path": f"{request.workspace}/{a.path}", "media_type": a.media_type, "size": a.size}
        for a in request.attachments
    ]
    return json.dumps(files, separators=(",", ":"))


def text_message(message: dict[str, Any]) -> str | None:
    """A ``text`` message's text (``""`` when it holds none), None for any other message
    (:class:`adapters.protocol.TextMessages`)."""
    if message.get("type") != "text":
        return None
    text = message.get("text")  # coerce.text, inlined: once per line of a flood
    return text if isinstance(text, str) else ""


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    kind = message.get("type")
    if kind == "session":
        session_id = message.get("id")
        if not isinstance(session_id, str) or not session_id:
            return []
        model = message.get("model")
        state.session_id = session_id
        state.model = model if isinstance(model, str) else None
        resumed = state.offered_session is not None and session_id == state.offered_session
        return [Session(session_id=session_id, resumed=resumed, model=state.model)]
    if kind == "text":
        text = text_message(message) or ""
        return [AssistantText(text=text)] if text else []
    if kind == "activity":
        activity = message.get("kind")
        return [
            SandboxActivity(
                kind=activity if activity in _ACTIVITY_KINDS else "other",
                description=coerce.text(message.get("description")),
            )
        ]
    if kind == "permission":
        command = message.get("command")
        if state.ask:
            native = message.get("id")
            state.asks.append(
                Ask(
                    native_id=native if isinstance(native, str | int) else str(native),
                    tool=coerce.text(message.get("tool")) or "permission",
                    input=command if isinstance(command, str) else message.get("input"),
                    description=coerce.text(message.get("description")),
                    command=command if isinstance(command, str) else None,
                )
            )
            return []
        return [
            PermissionRequest(
                request_id=str(message.get("id", "")),
                description=coerce.text(message.get("description")),
                command=command if isinstance(command, str) else None,
            )
        ]
    if kind == "usage":
        cost = message.get("cost_usd")
        usage = Usage(
            input_tokens=coerce.count(message.get("input_tokens")),
            output_tokens=coerce.count(message.get("output_tokens")),
            cached_input_tokens=coerce.count(message.get("cached_input_tokens")),
            cost_usd=float(cost)
            if isinstance(cost, int | float) and not isinstance(cost, bool)
            else None,
        )
        state.input_tokens += usage.input_tokens
        state.output_tokens += usage.output_tokens
        if usage.cost_usd is not None:
            state.cost_usd = (state.cost_usd or 0.0) + usage.cost_usd
        return [usage]
    if kind == "complete":
        return [
            TurnComplete(
                text=coerce.text(message.get("text")),
                session_id=state.session_id,
                model=state.model,
                input_tokens=state.input_tokens,
                output_tokens=state.output_tokens,
                cost_usd=state.cost_usd,
            )
        ]
    if kind == "error":
        error = coerce.text(message.get("message")) or "the harness reported an error"
        if state.offered_session is not None and message.get("code") == "session-not-found":
            state.resume_rejected = True
        return [_error_event(error, message)]
    return []


# What a harness may report of its own error: a worker-side reason (a cancel, a lost worker)
# or ``budget`` is the worker's to say, never the harness's.
_HARNESS_REASONS: frozenset[str] = frozenset({"rate-limited", "quota", "auth", "harness-error"})


def _error_event(error: str, message: dict[str, Any]) -> Event:
    """An ``error`` line as a ``session-error``: its ``reason`` when it is one a harness may
    report (else ``harness-error``), ``retry_after_s`` when a non-negative number. A quota
    is retryable only with a reset time, as the contract says."""
    reason = message.get("reason")
    if reason not in _HARNESS_REASONS:
        reason = "harness-error"
    after = message.get("retry_after_s")
    retry_after = (
        float(after)
        if isinstance(after, int | float) and not isinstance(after, bool) and 0 <= after < 1e9
        else None
    )
    retryable = None
    if reason == "quota":
        retryable = retry_after is not None
    return session_error(error, reason, retryable=retryable, retry_after_s=retry_after)  # type: ignore[arg-type]


def steer(state: State, text: str) -> bool:
    """A ``message`` line on the harness's stdin, which stays open only under ``--posture
    ask`` (otherwise stdin closes after the input, as the protocol says)."""
    if not state.ask:
        return False
    line = {"type": "message", "text": text, "mode": "steer"}
    state.outbox.append(json.dumps(line).encode("utf-8") + b"\n")
    return True


def answer(state: State, ask: Ask, decision: Decision) -> None:
    """The decision line for a ``permission`` line, on the harness's stdin."""
    line = {
        "type": "decision",
        "id": ask.native_id,
        "decision": "allow" if decision.allow else "deny",
        "scope": "always" if decision.always else "once",
        "message": decision.message,
    }
    if decision.abort:
        line["abort"] = True
    state.outbox.append(json.dumps(line).encode("utf-8") + b"\n")


def finish(state: State, exit: ExitInfo) -> list[Event]:
    return []


def policy_warning(request: TurnRequest) -> str | None:
    if request.posture == "ask" and not (request.allow or request.deny):
        return None  # the harness's own permission lines are asked of us: nothing unapplied
    if request.posture != "dangerous" or request.allow or request.deny:
        return (
            "stdio-json enforces no permission policy: posture and allow/deny patterns "
            "are not applied by the harness"
        )
    return None
