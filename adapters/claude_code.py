"""claude-code: ``claude -p --output-format stream-json --verbose``; fixtures from 2.1.328.

The one-shot mode. ``--posture ask`` adds a stdin control channel to the same invocation
(:mod:`adapters.claude_control`), whose other messages are this mode's, mapped here.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from adapters import coerce, mcp_config
from adapters.errors import classify, error_event
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

HARNESS_ID = "claude-code"

CAPABILITIES = Capabilities(
    session_resume=True,
    system_prompt=True,
    permission_policy="full",
    permission_hooks=False,
    mid_turn_cancel=True,
    usage_reporting=True,
    cost_reporting=True,
    model_selection=True,
    model_reporting=True,
    mcp_client=True,
    mcp_ask=True,
    permission_ask=True,
    attachments="images",
    structured_output="native",
    steering="ask-mode",
)

# Messages we map: system (init, api_retry, permission_denied), assistant (text / tool_use
# blocks, message.model), result (is_error, result, usage, total_cost_usd,
# permission_denials, api_error_status, errors). Everything else is ignored.
_STALE = re.compile(r"No conversation found with session ID", re.I)
_FILE_TOOLS = {"Edit", "MultiEdit", "Write", "NotebookEdit"}
# The CLI's own stand-in for an answer it never got (API errors): not the model used.
_SYNTHETIC_MODEL = "<synthetic>"


@dataclass
class State(AdapterState):
    offered_session: str | None
    session_sent: bool = False
    api_error: str | None = None
    retry_delay_s: float | None = None
    commands: dict[str, str] = field(default_factory=dict)
    denied: set[str] = field(default_factory=set)


def new_state(request: TurnRequest) -> State:
    return State(offered_session=request.resume_session)


def build_command(request: TurnRequest) -> Command:
    """The prompt goes on stdin: ``claude -p`` with no prompt argument reads it to EOF, so a
    1 MiB input or one starting with ``-`` needs no argv. The system prompt travels as a file
    (``--append-system-prompt-file``: appended to Claude Code's own prompt, no argv limit).
    A turn with images sends its input as one stream-json ``user`` message instead, the
    images as base64 ``image`` blocks beside the text (``--input-format stream-json``)."""
    if any(a.image for a in request.attachments):
        return command(request, [*_posture(request), *STREAM_INPUT], user_message(request))
    return command(request, _posture(request), request.input.encode("utf-8"))


STREAM_INPUT = ("--input-format", "stream-json")


def user_message(request: TurnRequest) -> bytes:
    """The turn input as a stream-json ``user`` message line, with its images."""
    images = [
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": a.media_type,
                "data": base64.b64encode(a.data).decode("ascii"),
            },
        }
        for a in request.attachments
        if a.image and a.data
    ]
    content: str | list[dict[str, Any]] = request.input
    if images:
        content = [*images, {"type": "text", "text": request.input}]
    line = {
        "type": "user",
        "message": {"role": "user", "content": content},
        "parent_tool_use_id": None,
        "session_id": "",
    }
    return json.dumps(line).encode("utf-8") + b"\n"


def _posture(request: TurnRequest) -> list[str]:
    if request.posture == "dangerous":
        return ["--dangerously-skip-permissions"]
    # strict (dontAsk): only what needs no approval runs (reads, read-only commands), the
    # rest is denied; auto (acceptEdits): file edits are accepted too. Other commands need
    # an --allowedTools pattern in both.
    return ["--permission-mode", "dontAsk" if request.posture == "strict" else "acceptEdits"]


def command(
    request: TurnRequest, permissions: list[str], stdin: bytes, *, keep_stdin: bool = False
) -> Command:
    """claude's invocation in either mode, ``permissions`` the flags of its posture."""
    argv = [request.executable or "claude", "-p", "--output-format", "stream-json", "--verbose"]
    files: dict[str, str] = {}
    env = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    if request.resume_session:
        argv += ["--resume", request.resume_session]
    if request.model:
        argv += ["--model", request.model]
    if request.system_prompt:
        path = f"{request.home.rstrip('/')}/.harness/claude-system-prompt.md"
        files[path] = request.system_prompt
        argv += ["--append-system-prompt-file", path]
    argv += permissions
    if request.mcp_servers:
        # 2.1.328: only these servers (--strict-mcp-config: none of the user's or project's),
        # the credential passed on by name (it expands ${NAME} in the file).
        path = f"{request.home.rstrip('/')}/{mcp_config.COMMON_FILE}"
        files[path] = mcp_config.common_json(request.mcp_servers, lambda name: f"${{{name}}}")
        argv += ["--mcp-config", path, "--strict-mcp-config"]
    if request.output_schema is not None:
        # 2.1.328 offers the model a StructuredOutput tool with this schema as its input and
        # reports the call's input as the result's structured_output.
        argv += ["--json-schema", json.dumps(request.output_schema, separators=(",", ":"))]
    if request.posture == "dangerous":
        # 2.1.328 refuses the skip flag as root unless told it is sandboxed; the dangerous
        # posture is the producer saying exactly that.
        env["IS_SANDBOX"] = "1"
    # Both flags take a variable number of values: each pattern is one argv element, and no
    # positional argument follows them.
    allowed = [*request.allow, *_attached(request)]
    if allowed:
        argv += ["--allowedTools", *allowed]
    if request.deny:
        argv += ["--disallowedTools", *request.deny]
    if request.base_url:
        env["ANTHROPIC_BASE_URL"] = request.base_url
    return Command(tuple(argv), stdin, env, files, cwd=request.workspace, keep_stdin=keep_stdin)


def _attached(request: TurnRequest) -> list[str]:
    """The attached servers' tools are allowed (the operator attached them), except under
    ``--posture ask``, where they are asked like any other tool."""
    if request.posture == "ask":
        return []
    return [f"mcp__{server.name}" for server in request.mcp_servers]


def _session(state: State) -> list[Event]:
    if state.session_sent or state.session_id is None:
        return []
    state.session_sent = True
    resumed = state.offered_session is not None and state.session_id == state.offered_session
    return [Session(session_id=state.session_id, resumed=resumed, model=state.model)]


def _activity(block: dict[str, Any]) -> SandboxActivity:
    name = coerce.nonempty(block.get("name")) or "tool"
    args = coerce.mapping(block.get("input"))
    if name == "Bash" and coerce.nonempty(args.get("command")):
        return SandboxActivity(kind="command", description=args["command"])
    if name in _FILE_TOOLS:
        path = (
            coerce.nonempty(args.get("file_path"))
            or coerce.nonempty(args.get("notebook_path"))
            or ""
        )
        return SandboxActivity(kind="file", description=f"{name} {path}".strip())
    return SandboxActivity(kind="tool", description=name)


def _assistant(message: dict[str, Any], state: State) -> list[Event]:
    body = message.get("message")
    if not isinstance(body, dict):
        return []
    blocks = [b for b in coerce.items(body.get("content")) if isinstance(b, dict)]
    if body.get("model") == _SYNTHETIC_MODEL or message.get("is_api_error_message"):
        texts = [
            b["text"] for b in blocks if b.get("type") == "text" and coerce.nonempty(b.get("text"))
        ]
        state.api_error = "\n".join(texts) or state.api_error
        return []
    state.model = coerce.nonempty(body.get("model")) or state.model
    out = _session(state)
    for block in blocks:
        if block.get("type") == "text" and coerce.nonempty(block.get("text")):
            out.append(AssistantText(text=block["text"]))
        elif block.get("type") == "tool_use":
            out.append(_activity(block))
            if out[-1].type == "sandbox-activity" and out[-1].kind == "command":
                state.commands[coerce.nonempty(block.get("id")) or ""] = out[-1].description
    return out


def _denial(tool_id: str, name: str, message: str | None, state: State) -> list[Event]:
    if tool_id in state.denied:
        return []
    state.denied.add(tool_id)
    text = message or f"{name} was denied by the permission policy"
    command = state.commands.get(tool_id)
    return [PermissionRequest(request_id=tool_id, description=text, command=command)]


def _system(message: dict[str, Any], state: State) -> list[Event]:
    subtype = message.get("subtype")
    if subtype == "init":
        state.session_id = coerce.nonempty(message.get("session_id")) or state.session_id
        return []
    if subtype == "permission_denied":
        tool_id = coerce.nonempty(message.get("tool_use_id")) or ""
        name = coerce.nonempty(message.get("tool_name")) or "tool"
        return _denial(tool_id, name, coerce.nonempty(message.get("message")), state)
    if subtype == "api_retry":
        delay = _num(message.get("retry_delay_ms"))
        state.retry_delay_s = delay / 1000 if delay is not None else state.retry_delay_s
        status = message.get("error_status")
        error = coerce.nonempty(message.get("error")) or ""
        if status in (401, 403) or error == "authentication_failed":
            # The CLI would retry a rejected key 10 times over minutes: end the turn now.
            detail = f"the model API rejected the credentials (HTTP {status}, {error})"
            return [session_error(detail, "auth")]
    return []


def _stale(state: State, detail: str, exit: ExitInfo | None = None) -> list[Event]:
    state.resume_rejected = state.offered_session is not None
    state.session_id = None
    code, tail = (exit.exit_code, exit.stderr_tail) if exit else (None, "")
    return [session_error(detail, "harness-error", exit_code=code, stderr_tail=tail)]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and type(value) is not bool else None


def _cost(message: dict[str, Any], state: State) -> float | None:
    # On a resumed session total_cost_usd is the whole conversation's (2.1.328); this
    # invocation's is in model_usage_since_last_result.
    raw = message.get("model_usage_since_last_result")
    since = [_num(v.get("costUSD")) for v in coerce.mapping(raw).values() if isinstance(v, dict)]
    if since and None not in since:
        return sum(c or 0.0 for c in since)
    resumed = state.offered_session is not None and state.offered_session == state.session_id
    return None if resumed else _num(message.get("total_cost_usd"))


def _usage(message: dict[str, Any], state: State) -> Usage:
    usage = coerce.mapping(message.get("usage"))
    cached = coerce.count(usage.get("cache_read_input_tokens"))
    # Anthropic counts cache reads and writes apart from input_tokens; ours includes them.
    fresh = coerce.count(usage.get("input_tokens")) + coerce.count(
        usage.get("cache_creation_input_tokens")
    )
    return Usage(
        input_tokens=fresh + cached,
        output_tokens=coerce.count(usage.get("output_tokens")),
        cached_input_tokens=cached,
        cost_usd=_cost(message, state),
    )


def _result(message: dict[str, Any], state: State) -> list[Event]:
    errors = [e for e in coerce.items(message.get("errors")) if isinstance(e, str)]
    text = coerce.nonempty(message.get("result")) or ""
    failed = message.get("is_error") is True  # 2.1.328 can say subtype "success" with it
    if failed and any(_STALE.search(e) for e in [*errors, text]):
        return _stale(state, "; ".join(errors) or text)
    state.session_id = state.session_id or coerce.nonempty(message.get("session_id"))
    out = _session(state)
    usage = _usage(message, state)
    if usage.input_tokens or usage.output_tokens or usage.cost_usd:
        out.append(usage)
    for denial in coerce.items(message.get("permission_denials")):
        if isinstance(denial, dict):
            tool_id, name = (
                coerce.nonempty(denial.get("tool_use_id")) or "",
                coerce.nonempty(denial.get("tool_name")),
            )
            command = coerce.nonempty(coerce.mapping(denial.get("tool_input")).get("command"))
            if name == "Bash" and command:
                state.commands.setdefault(tool_id, command)
            out += _denial(tool_id, name or "tool", None, state)
    if not failed:
        totals = usage.model_dump(include={"input_tokens", "output_tokens", "cost_usd"})
        done = TurnComplete(
            text=text,
            session_id=state.session_id,
            model=state.model,
            structured=message.get("structured_output"),  # with --json-schema
            **totals,
        )
        return [*out, done]
    detail = "; ".join(errors) or text or state.api_error or "Claude Code reported an error"
    status = message.get("api_error_status")
    found = classify(
        f"{detail} {message.get('api_error') or ''}", status if isinstance(status, int) else None
    )
    retry_after = found.retry_after_s
    if found.reason == "rate-limited" and retry_after is None:
        retry_after = state.retry_delay_s  # the CLI's own backoff, when the API named none
    return [
        *out,
        session_error(detail, found.reason, retryable=found.retryable, retry_after_s=retry_after),
    ]


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    kind = message.get("type")
    if kind == "system":
        return _system(message, state)
    if kind == "assistant":
        return _assistant(message, state)
    if kind == "result":
        return _result(message, state)
    return []


def finish(state: State, exit: ExitInfo) -> list[Event]:
    if state.offered_session and _STALE.search(exit.stderr_tail):
        detail = f"claude could not resume {state.offered_session}: no such session"
        return _stale(state, detail, exit)
    if state.api_error:
        return [
            error_event(state.api_error, exit_code=exit.exit_code, stderr_tail=exit.stderr_tail)
        ]
    return []


def policy_warning(request: TurnRequest) -> str | None:
    # Every posture and pattern is enforced by the CLI; deny rules hold even with
    # --dangerously-skip-permissions (verified live with 2.1.328).
    return None
