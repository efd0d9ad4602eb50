"""codex: ``codex exec --json`` (and ``codex exec resume``); fixtures from codex-cli 0.169.0.

The one-shot mode, which never asks. ``--posture ask`` runs ``codex app-server`` instead
(:mod:`adapters.codex_app_server`), with the same config file (:func:`config_file`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from adapters import coerce
from adapters.errors import classify, error_event
from adapters.events import (
    AssistantText,
    Event,
    SandboxActivity,
    Session,
    TurnComplete,
    Usage,
    session_error,
)
from adapters.protocol import AdapterState, Capabilities, Command, ExitInfo, TurnRequest

HARNESS_ID = "codex"

CAPABILITIES = Capabilities(
    session_resume=True,
    system_prompt=True,
    permission_policy="posture-only",
    permission_hooks=False,
    mid_turn_cancel=True,
    usage_reporting=True,
    cost_reporting=False,
    model_selection=True,
    model_reporting=False,
    mcp_client=True,
    permission_ask=True,
    attachments="images",
    structured_output="native",
    steering="ask-mode",
)

# Messages we map: thread.started (thread_id), item.started / item.completed (items
# command_execution, file_change, mcp_tool_call, web_search, agent_message), turn.completed
# (usage: a running total for the whole thread), turn.failed (error.message), error
# (message: transient "Reconnecting..." notices as well as fatal errors).
_STALE = re.compile(r"no rollout found|thread/resume failed", re.I)
# Codex's own sandbox (0.169.0: bubblewrap; the legacy Landlock backend panics) needs user
# namespaces, which a hardened container (default seccomp, no capabilities) refuses: every
# command then fails with "bwrap: No permissions to create a new namespace". strict keeps it
# (read-only: fails closed there, enforced by codex where namespaces exist); auto runs
# unsandboxed and the run's container (read-only root, writable workspace) confines it.
_SANDBOX = {
    "strict": "read-only",
    "auto": "danger-full-access",
    "dangerous": "danger-full-access",
}
_KEY_NAMES = ("OPENAI_API_KEY", "CODEX_API_KEY")
_TOTALS = ("input_tokens", "cached_input_tokens", "output_tokens")


@dataclass
class State(AdapterState):
    offered_session: str | None
    prior: dict[str, Any]
    answer: str = ""
    last_error: str | None = None
    seen_items: set[str] = field(default_factory=set)


def new_state(request: TurnRequest) -> State:
    return State(
        offered_session=request.resume_session, prior=dict(request.carry), carry=dict(request.carry)
    )


def _toml(value: str) -> str:
    # A JSON string is a TOML basic string, except that TOML also wants DEL escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def config_file(request: TurnRequest, sandbox_mode: str) -> dict[str, str]:
    """``$HOME/.codex/config.toml``, which ``exec``, ``exec resume`` and ``app-server`` read:
    the sandbox mode, the system prompt, the provider of a base URL, the run's MCP servers."""
    home = request.home.rstrip("/")
    return {f"{home}/.codex/config.toml": _config(request, sandbox_mode)}


def _config(request: TurnRequest, sandbox_mode: str) -> str:
    lines = [
        f"sandbox_mode = {_toml(sandbox_mode)}",
        # exec never asks anyway; say so, so a config default cannot make it wait.
        'approval_policy = "never"',
    ]
    if request.system_prompt:
        # Lands as a developer message of the Responses input, after Codex's own
        # instructions (0.169.0). In the config file rather than `-c` to avoid argv limits.
        lines.append(f"developer_instructions = {_toml(request.system_prompt)}")
    if request.base_url:
        # 0.169.0 ignores OPENAI_BASE_URL; a custom provider is the way to move it.
        granted = [k for k in _KEY_NAMES if k in request.granted_env]
        key = granted[0] if granted else sorted(request.granted_env or {"OPENAI_API_KEY"})[0]
        lines += [
            'model_provider = "harness"',
            "",
            "[model_providers.harness]",
            'name = "harness"',
            f"base_url = {_toml(request.base_url)}",
            'wire_api = "responses"',
            f"env_key = {_toml(key)}",
        ]
    for server in request.mcp_servers:
        # 0.169.0 starts a stdio server with a cleared environment: env_vars names what it
        # passes on (the run's credential), so no value is written here.
        lines += [
            "",
            f"[mcp_servers.{server.name}]",
            f"command = {_toml(server.command[0])}",
            f"args = [{', '.join(_toml(a) for a in server.command[1:])}]",
            f"env_vars = [{', '.join(_toml(n) for n in server.env)}]",
            # The app-server (--posture ask) would elicit each call, which it cannot do
            # headless: approved here, and asked by the run's endpoint (mcp_ask false).
            'default_tools_approval_mode = "approve"',
        ]
    return "\n".join(lines) + "\n"


def build_command(request: TurnRequest) -> Command:
    """The prompt is ``-``: codex then reads the whole input from stdin (no argv limit, and
    an input starting with ``-`` is not taken for a flag). Everything else goes into
    :func:`config_file`."""
    argv = [request.executable or "codex", "exec"]
    if request.resume_session:
        argv += ["resume", request.resume_session]
    argv += ["--json", "--skip-git-repo-check"]
    if request.model:
        argv += ["--model", request.model]
    files = config_file(request, _SANDBOX[request.posture])
    # -i takes several values: each image as one --image=PATH element, so "-" stays the prompt.
    argv += [f"--image={request.workspace}/{a.path}" for a in request.attachments if a.image]
    if request.output_schema is not None:
        path = f"{request.home.rstrip('/')}/.harness/codex-output-schema.json"
        files = {**files, path: json.dumps(request.output_schema)}
        argv += ["--output-schema", path]
    argv.append("-")
    return Command(
        argv=tuple(argv),
        stdin=request.input.encode("utf-8"),
        files=files,
        cwd=request.workspace,
    )


def _item(item: dict[str, Any], state: State) -> list[Event]:
    kind = item.get("type")
    if kind == "agent_message":
        text = coerce.nonempty(item.get("text"))
        if text is None:
            return []
        state.answer = text
        return [AssistantText(text=text)]
    item_id = coerce.nonempty(item.get("id")) or ""
    if item_id and item_id in state.seen_items:
        return []
    if kind == "command_execution":
        activity = SandboxActivity(
            kind="command", description=coerce.nonempty(item.get("command")) or ""
        )
    elif kind == "file_change":
        changes = [c for c in coerce.items(item.get("changes")) if isinstance(c, dict)]
        paths = ", ".join(f"{c.get('kind', 'update')} {c.get('path', '')}" for c in changes)
        activity = SandboxActivity(kind="file", description=paths or "file change")
    elif kind == "mcp_tool_call":
        name = ".".join(
            s for s in (coerce.nonempty(item.get("server")), coerce.nonempty(item.get("tool"))) if s
        )
        activity = SandboxActivity(kind="tool", description=name or "mcp tool")
    elif kind == "web_search":
        activity = SandboxActivity(kind="tool", description=f"web_search {item.get('query', '')}")
    else:
        return []  # reasoning, todo_list, and "error" items (non-fatal warnings)
    if item_id:
        state.seen_items.add(item_id)
    return [activity]


def _completed(message: dict[str, Any], state: State) -> list[Event]:
    raw = message.get("usage")
    usage: dict[str, Any] = raw if isinstance(raw, dict) else {}
    totals = {name: coerce.count(usage.get(name)) for name in _TOTALS}
    # The thread's running total: subtract what earlier turns of this run already counted.
    prior = state.prior if state.prior.get("thread_id") == state.session_id else {}
    turn = {name: max(totals[name] - coerce.count(prior.get(name)), 0) for name in _TOTALS}
    state.carry = {"thread_id": state.session_id, **totals}
    return [
        Usage(
            input_tokens=turn["input_tokens"],
            output_tokens=turn["output_tokens"],
            cached_input_tokens=turn["cached_input_tokens"],
        ),
        TurnComplete(
            text=state.answer,
            session_id=state.session_id,
            model=None,
            input_tokens=turn["input_tokens"],
            output_tokens=turn["output_tokens"],
        ),
    ]


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    kind = message.get("type")
    if kind == "thread.started":
        thread_id = coerce.nonempty(message.get("thread_id"))
        if thread_id is None or state.session_id is not None:
            return []
        state.session_id = thread_id
        resumed = state.offered_session is not None and thread_id == state.offered_session
        return [Session(session_id=thread_id, resumed=resumed, model=None)]
    if kind in ("item.started", "item.updated", "item.completed"):
        item = message.get("item")
        return _item(item, state) if isinstance(item, dict) else []
    if kind == "error":
        state.last_error = coerce.nonempty(message.get("message")) or state.last_error
        return []
    if kind == "turn.completed":
        return _completed(message, state)
    if kind == "turn.failed":
        raw = message.get("error")
        error = raw if isinstance(raw, dict) else {}
        detail = (
            coerce.nonempty(error.get("message"))
            or state.last_error
            or "codex reported a failed turn"
        )
        return [error_event(detail)]
    return []


def finish(state: State, exit: ExitInfo) -> list[Event]:
    tail, code = exit.stderr_tail, exit.exit_code
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    if state.offered_session and state.session_id is None and _STALE.search(tail):
        # 0.169.0: "Error: thread/resume: thread/resume failed: no rollout found for thread
        # id …" on stderr, exit 1, nothing on stdout.
        state.resume_rejected = True
        detail = f"codex could not resume {state.offered_session}: no such thread"
        return [session_error(detail, "harness-error", exit_code=code, stderr_tail=tail)]
    if "input_too_large" in tail:  # 0.169.0 takes at most 1048576 characters of input
        return [session_error(last, "invalid-input", exit_code=code, stderr_tail=tail)]
    for text, detail in ((state.last_error or "", state.last_error or ""), (tail, last)):
        if detail and classify(text).reason != "harness-error":
            return [error_event(detail, text=text, exit_code=code, stderr_tail=tail)]
    return []


def policy_warning(request: TurnRequest) -> str | None:
    parts = []
    if request.posture == "auto":
        parts.append(
            "codex runs its commands outside its own sandbox in the auto posture "
            "(only the run's container confines them)"
        )
    if request.allow or request.deny:
        parts.append("allow/deny patterns are not translated for codex")
    return "; ".join(parts) or None
