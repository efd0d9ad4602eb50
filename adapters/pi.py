"""pi: `pi -p --mode json`, fixtures recorded with @mariozechner/pi-coding-agent 0.73.1.

The one-shot mode. ``--posture ask`` runs ``pi --mode rpc`` instead (:mod:`adapters.pi_rpc`),
with the same options (:func:`invocation`); its agent events are this mode's, mapped here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from adapters import coerce, pi_mcp
from adapters.errors import classify
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
from adapters.protocol import AdapterState, Capabilities, Command, ExitInfo, TurnRequest

HARNESS_ID = "pi"

CAPABILITIES = Capabilities(
    session_resume=True,
    system_prompt=True,
    permission_policy="posture-only",  # tool allowlists only: no per-command rules in pi
    permission_hooks=False,
    mid_turn_cancel=True,
    usage_reporting=True,
    cost_reporting=True,
    model_selection=True,
    # 0.73.1 names, in every assistant message, the model it addressed (ours, from --model),
    # never the one the API says answered: an echo of the request, not a report.
    model_reporting=False,
    mcp_client=True,
    mcp_ask=True,
    permission_ask=True,
    attachments="images",
    steering="ask-mode",
)

#: The provider name our models.json gives the endpoint of ``request.base_url``.
PROVIDER = "harness"
_KEY_PREFERENCE = ("PI_API_KEY", "OPENAI_API_KEY")
#: Built-in tools per posture (0.73.1 offers read, bash, edit, write by default).
_POSTURES = {
    "strict": ("read", "grep", "find", "ls"),
    "auto": ("read", "grep", "find", "ls", "edit", "write"),
    "dangerous": ("read", "bash", "edit", "write", "grep", "find", "ls"),
    # ask: all of them, bash, edit and write asked of us first (adapters.pi_rpc).
    "ask": ("read", "bash", "edit", "write", "grep", "find", "ls"),
}
#: Pattern tool names (``Tool`` or ``Tool(spec)``, Claude's or pi's) → pi tool names.
_TOOLS = {
    **{name: name for name in ("read", "bash", "edit", "write", "grep", "find", "ls")},
    "glob": "find",
    "multiedit": "edit",
    "shell": "bash",
}
_PATTERN = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*(?:\((.*)\))?\s*$", re.S)
_FAILED = frozenset({"error", "aborted"})


@dataclass
class State(AdapterState):
    offered_session: str | None
    priced: bool
    announced: bool = False
    tool_calls: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    last_text: str = ""
    failure: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


def new_state(request: TurnRequest) -> State:
    # A model we describe ourselves (base_url) has no price: pi reports 0 for it.
    return State(offered_session=request.resume_session, priced=request.base_url is None)


def allowed_outright(request: TurnRequest) -> set[str]:
    """The pi tools the run allows as a whole (a pattern naming the tool, no command)."""
    return {tool for tool, scoped in _patterns(request.allow) if not scoped}


def _patterns(patterns: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(pi tool, scoped) for each pattern that names a pi tool."""
    found = []
    for pattern in patterns:
        match = _PATTERN.match(pattern)
        if match and match.group(1).lower() in _TOOLS:
            found.append((_TOOLS[match.group(1).lower()], bool((match.group(2) or "").strip())))
    return found


def tools_for(request: TurnRequest) -> list[str]:
    """The ``--tools`` allowlist: the posture's tools, plus tools allowed as a whole, minus
    every denied tool (a command-scoped deny such as ``Bash(rm *)`` removes all of bash;
    a command-scoped allow adds nothing: pi cannot narrow a tool, so both fail closed)."""
    tools = list(_POSTURES[request.posture])
    tools += [tool for tool, scoped in _patterns(request.allow) if not scoped]
    denied = {tool for tool, _ in _patterns(request.deny)}
    return [tool for tool in dict.fromkeys(tools) if tool not in denied]


def _vision(request: TurnRequest) -> dict[str, Any]:
    # 0.73.1 drops a prompt's images ("image omitted: model does not support images") for a
    # model whose "input" does not list "image" (the default is text only).
    return {"input": ["text", "image"]} if any(a.image for a in request.attachments) else {}


def invocation(
    request: TurnRequest, mode: tuple[str, ...]
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """pi's argv (``mode`` flags, then provider, model, session, system prompt file and the
    tool allowlist), environment and files, in either mode."""
    argv = [request.executable or "pi", *mode]
    files: dict[str, str] = {}
    if request.base_url:
        if not request.model:
            raise ValueError("pi needs a model name to use a base URL (--model)")
        # apiKey names a variable; pi reads it from the environment (else uses it as is).
        key = next((k for k in _KEY_PREFERENCE if k in request.granted_env), None)
        provider = {
            "baseUrl": request.base_url,
            "api": "openai-completions",
            "apiKey": key or min(request.granted_env, default="PI_API_KEY"),
            "models": [{"id": request.model, "name": request.model, **_vision(request)}],
        }
        models = {"providers": {PROVIDER: provider}}
        files[f"{request.home}/.pi/agent/models.json"] = json.dumps(models, indent=2)
        argv += ["--provider", PROVIDER, "--model", request.model]
    elif request.model and "/" in request.model:
        provider_name, model = request.model.split("/", 1)
        argv += ["--provider", provider_name, "--model", model]
    elif request.model:
        argv += ["--model", request.model]
    if request.resume_session:
        argv += ["--session", request.resume_session]
    if request.system_prompt:
        # pi reads an existing file named by --append-system-prompt (no argv size limit).
        path = f"{request.home}/.pi/harness-system-prompt.md"
        files[path] = request.system_prompt
        argv += ["--append-system-prompt", path]
    tools = [*tools_for(request), *pi_mcp.tool_names(request)]
    argv += ["--tools", ",".join(tools)] if tools else ["--no-tools"]
    env = {
        "PI_OFFLINE": "1",  # no update checks or other start-up network calls
        "PI_CODING_AGENT_DIR": f"{request.home}/.pi/agent",  # models.json, sessions
    }
    mcp_argv, mcp_env, mcp_files = pi_mcp.extension(request)  # the run's MCP servers
    return [*argv, *mcp_argv], {**env, **mcp_env}, {**files, **mcp_files}


def build_command(request: TurnRequest) -> Command:
    """The input goes on stdin: pi reads a piped stdin to EOF and makes it the prompt (no
    argv size limit; in argv, a prompt starting with ``-`` or ``@`` would be taken for an
    option or a file, and 0.73.1 has no ``--``). pi trims the piped text's outer blanks."""
    argv, env, files = invocation(request, ("-p", "--mode", "json"))
    # An image as an @FILE argument: pi attaches it to the prompt as an image.
    argv += [f"@{request.workspace}/{a.path}" for a in request.attachments if a.image]
    return Command(tuple(argv), request.input.encode("utf-8"), env, files, request.workspace)


def session_events(state: State) -> list[Event]:
    if state.announced or state.session_id is None:
        return []
    state.announced = True
    offered = state.offered_session
    resumed = bool(offered) and state.session_id.startswith(offered or "")  # pi takes prefixes
    return [Session(session_id=state.session_id, resumed=resumed, model=state.model)]


def failed_event(text: str, exit_code: int | None = None, stderr: str = "") -> Event:
    # pi 0.73.1 passes the OpenAI SDK's message on: "<status> <body message>".
    match = re.match(r"\s*([1-5]\d\d)\b", text)
    found = classify(text, int(match.group(1)) if match else None)
    return session_error(
        f"pi: {text}",
        found.reason,
        retryable=found.retryable,
        retry_after_s=found.retry_after_s,
        exit_code=exit_code,
        stderr_tail=stderr,
    )


def _usage(usage: dict[str, Any], state: State) -> list[Event]:
    cached = coerce.count(usage.get("cacheRead"))
    cost = coerce.mapping(usage.get("cost")).get("total")
    event = Usage(
        # pi's input leaves out cache reads and writes; ours is the whole prompt.
        input_tokens=coerce.count(usage.get("input"))
        + cached
        + coerce.count(usage.get("cacheWrite")),
        output_tokens=coerce.count(usage.get("output")),
        cached_input_tokens=cached,
        cost_usd=float(cost) if state.priced and isinstance(cost, int | float) else None,
    )
    if not (event.input_tokens or event.output_tokens or event.cost_usd):
        return []  # a failed call: pi reports zeros
    state.input_tokens += event.input_tokens
    state.output_tokens += event.output_tokens
    if event.cost_usd is not None:
        state.cost_usd = (state.cost_usd or 0.0) + event.cost_usd
    return [event]


def _assistant(message: dict[str, Any], state: State) -> list[Event]:
    """An assistant message_end: its text, its usage (read only here: every message_update
    repeats the running partial usage), its stop reason."""
    state.model = coerce.text(message.get("model")) or state.model
    events = session_events(state)
    blocks = [coerce.mapping(b) for b in coerce.items(message.get("content"))]
    state.last_text = "".join(coerce.text(b.get("text")) for b in blocks if b.get("type") == "text")
    if state.last_text:
        events.append(AssistantText(text=state.last_text))
    events += _usage(coerce.mapping(message.get("usage")), state)
    reason = coerce.text(message.get("stopReason"))
    state.failure = (
        (coerce.text(message.get("errorMessage")) or reason) if reason in _FAILED else None
    )
    return events


def _activity(tool: str, args: dict[str, Any], failed: bool) -> SandboxActivity:
    kind: ActivityKind = "tool"
    description = f"{tool} {json.dumps(args, ensure_ascii=False)[:200]}"
    if tool == "bash":
        kind, description = "command", coerce.text(args.get("command"))
    elif tool in ("edit", "write"):
        kind, description = "file", f"{tool} {coerce.text(args.get('path'))}"
    return SandboxActivity(kind=kind, description=description + (" (failed)" if failed else ""))


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    kind = message.get("type")
    if kind == "session" and state.session_id is None and coerce.text(message.get("id")):
        state.session_id = message["id"]  # the header; the model comes with the first reply
    elif (
        kind == "message_start"
        and coerce.mapping(message.get("message")).get("role") == "assistant"
    ):
        state.model = coerce.text(message["message"].get("model")) or state.model
        return session_events(state)
    elif (
        kind == "message_end" and coerce.mapping(message.get("message")).get("role") == "assistant"
    ):
        return _assistant(message["message"], state)
    elif kind == "tool_execution_start":
        call = (coerce.text(message.get("toolName")), coerce.mapping(message.get("args")))
        state.tool_calls[coerce.text(message.get("toolCallId"))] = call
    elif kind == "tool_execution_end":
        tool, args = state.tool_calls.pop(coerce.text(message.get("toolCallId")), ("", {}))
        name = coerce.text(message.get("toolName")) or tool or "tool"
        return [_activity(name, args, message.get("isError") is True)]
    elif kind == "agent_end" and state.failure is None:
        # Final unless the last reply failed: then pi may retry (auto_retry_start follows).
        complete = TurnComplete(
            text=state.last_text,
            session_id=state.session_id,
            model=state.model,
            input_tokens=state.input_tokens,
            output_tokens=state.output_tokens,
            cost_usd=state.cost_usd,
        )
        return [*session_events(state), complete]
    elif kind == "auto_retry_end" and message.get("success") is False:
        text = coerce.text(message.get("finalError")) or state.failure or "the model call failed"
        return [*session_events(state), failed_event(text)]
    return []


def finish(state: State, exit: ExitInfo) -> list[Event]:
    """pi exits 0 after a failed model call (the error is only in the stream), and 1 when
    it cannot start, e.g. for a session id it does not know."""
    if state.failure is not None:
        return [
            *session_events(state),
            failed_event(state.failure, exit.exit_code, exit.stderr_tail),
        ]
    if state.offered_session and "No session found matching" in exit.stderr_tail:
        state.resume_rejected = True
        error = f"pi could not resume {state.offered_session}: no such session"
        tail = exit.stderr_tail
        return [session_error(error, "harness-error", exit_code=exit.exit_code, stderr_tail=tail)]
    return session_events(state)


def policy_warning(request: TurnRequest) -> str | None:
    patterns = (*request.allow, *request.deny)
    inexact = [p for p in patterns if not any(not scoped for _, scoped in _patterns((p,)))]
    if not inexact:
        return None
    return (
        "pi has no per-command permissions, only a tool allowlist: these patterns are applied "
        "to whole tools (a deny removes the tool, an allow adds nothing) or, naming no pi "
        f"tool, not at all: {', '.join(inexact)}"
    )
