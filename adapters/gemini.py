"""gemini: ``gemini -p "" --output-format stream-json``; fixtures from gemini-cli 0.61.0.

The one-shot mode. ``--posture ask`` runs ``gemini --acp`` instead (:mod:`adapters.gemini_acp`),
with the same settings, policy and system prompt (:func:`invocation`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from adapters import coerce, mcp_config
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

HARNESS_ID = "gemini"

CAPABILITIES = Capabilities(
    session_resume=True,
    system_prompt=True,
    permission_policy="full",
    permission_hooks=False,
    mid_turn_cancel=True,
    usage_reporting=True,
    cost_reporting=False,
    model_selection=True,
    model_reporting=True,
    mcp_client=True,
    mcp_ask=True,
    permission_ask=True,
    attachments="images",
)

# Messages we map: init (session_id; its model is the one requested), message (assistant
# deltas), tool_use (tool_name, parameters), tool_result (ends a narration segment), error
# (non-fatal warnings), result (status, error, stats with token counts and `models` keyed
# by the model that answered). Every line also carries a timestamp, which we ignore.
_APPROVAL = {"strict": "default", "auto": "auto_edit", "dangerous": "yolo"}
_FILE_TOOLS = {"write_file", "replace", "edit"}
_PATTERN = re.compile(r"^\s*([\w.*-]+)\s*(?:\((.*)\))?\s*$", re.S)
# Exit 42 (FatalInputError) with this on stderr when the offered session does not exist:
# "Error resuming session: No previous sessions found for this project." (0.61.0).
_STALE = re.compile(r"Error resuming session|Invalid session identifier", re.I)
_EXIT_AUTH = 41  # FatalAuthenticationError
# auth: GOOGLE_GEMINI_BASE_URL alone selects the "gateway" auth type, which headless mode
# refuses (exit 41). maxAttempts: 0.61.0 retries a 429 or 5xx up to 10 times 5-30 s apart
# with nothing on stdout; 3 ends a throttled turn within a minute, classified, so the
# worker (not a silent CLI loop) decides when to try again.
_SETTINGS = (
    json.dumps(
        {"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"maxAttempts": 3}}
    )
    + "\n"
)
# GEMINI_SYSTEM_MD replaces Gemini CLI's whole built-in system prompt (rendered at run time
# from the model, approval mode and tools, so it cannot be copied here). This short preamble
# keeps the tool list, through the file's ${AvailableTools} placeholder; ours follows.
_PREAMBLE = (
    "You are Gemini CLI, an autonomous agent working non-interactively on software tasks in "
    "the current directory. Use the available tools to inspect and change files and to run "
    "commands; finish with a concise answer.\n\nAvailable tools:\n${AvailableTools}\n\n"
)


@dataclass
class State(AdapterState):
    offered_session: str | None
    answer: list[str] = field(default_factory=list)
    last_error: str | None = None


def new_state(request: TurnRequest) -> State:
    return State(offered_session=request.resume_session)


def _rule(pattern: str, decision: str, priority: int) -> str:
    match = _PATTERN.match(pattern)
    if not match:
        raise ValueError(f"gemini tool pattern {pattern!r} is not NAME or NAME(ARGUMENT)")
    name, argument = match.groups()
    lines = ["[[rule]]", f"toolName = {json.dumps(name)}"]
    if argument and name == "run_shell_command":
        lines.append(f"commandPrefix = {json.dumps(argument.strip())}")
    elif argument:
        lines.append(f"argsPattern = {json.dumps(re.escape(argument.strip()))}")
    lines += [f'decision = "{decision}"', f"priority = {priority}"]
    return "\n".join(lines)


def _policy(request: TurnRequest) -> str:
    # User-tier rules; deny outranks allow so an overlap fails closed.
    rules = [_rule(p, "allow", 500) for p in request.allow]
    rules += [_rule(p, "deny", 900) for p in request.deny]
    return "\n\n".join(rules) + "\n"


def _settings(request: TurnRequest) -> str:
    """The run's settings: auth, retries and the run's MCP servers (``trust`` skips 0.61.0's
    confirmation of their tools, except under ``--posture ask``, where they are asked)."""
    if not request.mcp_servers:
        return _SETTINGS
    settings = json.loads(_SETTINGS)
    servers = mcp_config.common(request.mcp_servers, lambda name: f"${{{name}}}")["mcpServers"]
    for server in servers.values():
        server["trust"] = request.posture != "ask"
    settings["mcpServers"] = servers
    return json.dumps(settings) + "\n"


def invocation(
    request: TurnRequest, mode: tuple[str, ...], approval_mode: str, *, resume: bool
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """gemini's argv (``mode`` flags, then the model, the session when ``resume``, the
    approval mode and the policy file), environment and files, in either mode: auth, base
    URL, trust and the system prompt are files and environment."""
    home = request.home.rstrip("/")
    argv = [request.executable or "gemini", *mode]
    if request.model:
        argv += ["--model", request.model]
    if request.resume_session and resume:
        argv += ["--resume", request.resume_session]
    argv += ["--approval-mode", approval_mode]
    files = {f"{home}/.gemini/settings.json": _settings(request)}
    env = {"GEMINI_CLI_TRUST_WORKSPACE": "true"}
    if request.allow or request.deny:
        files[f"{home}/.harness/gemini-policy.toml"] = _policy(request)
        argv.append(f"--policy={home}/.harness/gemini-policy.toml")
    if request.system_prompt:
        files[f"{home}/.harness/gemini-system.md"] = _PREAMBLE + request.system_prompt + "\n"
        env["GEMINI_SYSTEM_MD"] = f"{home}/.harness/gemini-system.md"
    if request.base_url:
        env["GOOGLE_GEMINI_BASE_URL"] = request.base_url
    return argv, env, files


def build_command(request: TurnRequest) -> Command:
    """The input goes on stdin with an empty ``-p``: in headless mode 0.61.0 reads piped
    stdin (up to 8 MiB) and appends the ``-p`` text, so nothing large or starting with ``-``
    rides in argv. Model and session are flags."""
    mode = ("--output-format", "stream-json")
    argv, env, files = invocation(request, mode, _APPROVAL[request.posture], resume=True)
    argv += ["--prompt", references(request)]
    return Command(
        argv=tuple(argv),
        stdin=request.input.encode("utf-8"),
        env=env,
        files=files,
        cwd=request.workspace,
    )


def references(request: TurnRequest) -> str:
    """The turn's images as ``@path`` references (0.61.0 reads each with read_many_files and
    sends an image to the model as inline data); paths are workspace-relative, no blanks."""
    return " ".join(f"@{a.path}" for a in request.attachments if a.image)


def _tool(message: dict[str, Any]) -> SandboxActivity:
    name = coerce.nonempty(message.get("tool_name")) or "tool"
    args = coerce.mapping(message.get("parameters"))
    if name == "run_shell_command" and coerce.nonempty(args.get("command")):
        return SandboxActivity(kind="command", description=args["command"])
    if name in _FILE_TOOLS:
        return SandboxActivity(kind="file", description=f"{name} {args.get('file_path', '')}")
    return SandboxActivity(kind="tool", description=name)


def _used_model(stats: dict[str, Any]) -> str | None:
    # Keyed by the model that answered; with the router on, a classifier model shows up
    # too: the one that spent the most tokens did the work. None when nothing answered.
    models = {
        k: coerce.count(coerce.mapping(v).get("total_tokens"))
        for k, v in coerce.mapping(stats.get("models")).items()
    }
    models = {k: v for k, v in models.items() if v}
    return max(models, key=lambda k: models[k]) if models else None


def _result(message: dict[str, Any], state: State) -> list[Event]:
    stats = coerce.mapping(message.get("stats"))
    state.model = _used_model(stats) or state.model
    out: list[Event] = []
    if state.session_id is not None:
        resumed = state.offered_session is not None and state.session_id == state.offered_session
        out.append(Session(session_id=state.session_id, resumed=resumed, model=state.model))
    cached = coerce.count(stats.get("cached"))
    input_tokens, output_tokens = (
        coerce.count(stats.get("input_tokens")),
        coerce.count(stats.get("output_tokens")),
    )
    if input_tokens or output_tokens:
        out.append(
            Usage(
                input_tokens=input_tokens, output_tokens=output_tokens, cached_input_tokens=cached
            )
        )
    if message.get("status") != "success":
        error = coerce.mapping(message.get("error"))
        detail = (
            coerce.nonempty(error.get("message")) or state.last_error or "gemini reported an error"
        )
        return [*out, error_event(detail)]
    out.append(
        TurnComplete(
            text="".join(state.answer),
            session_id=state.session_id,
            model=state.model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )
    )
    return out


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    kind = message.get("type")
    if kind == "init":
        state.session_id = coerce.nonempty(message.get("session_id")) or state.session_id
        return []
    if kind == "message" and message.get("role") == "assistant":
        text = coerce.nonempty(message.get("content"))
        if text is None:
            return []
        state.answer.append(text)
        return [AssistantText(text=text)]
    if kind == "tool_use":
        state.answer.clear()  # the final answer is what follows the last tool call
        return [_tool(message)]
    if kind == "tool_result":
        state.answer.clear()
        return []
    if kind == "error":
        state.last_error = coerce.nonempty(message.get("message")) or state.last_error
        return []
    if kind == "result":
        return _result(message, state)
    return []


def finish(state: State, exit: ExitInfo) -> list[Event]:
    tail = exit.stderr_tail
    if state.offered_session and state.session_id is None and _STALE.search(tail):
        state.resume_rejected = True
        return [
            session_error(
                f"gemini could not resume {state.offered_session}: no such session",
                "harness-error",
                exit_code=exit.exit_code,
                stderr_tail=tail,
            )
        ]
    if exit.exit_code == _EXIT_AUTH:
        return [
            session_error(
                "gemini could not authenticate (exit 41)",
                "auth",
                exit_code=exit.exit_code,
                stderr_tail=tail,
            )
        ]
    for text in (state.last_error, tail):
        if text and classify(text).reason != "harness-error":
            return [
                error_event(
                    text.strip().splitlines()[-1] if text is tail else text,
                    text=text,
                    exit_code=exit.exit_code,
                    stderr_tail=tail,
                )
            ]
    return []


def policy_warning(request: TurnRequest) -> str | None:
    # Every posture and pattern is enforced by the CLI (its approval mode and policy file).
    return None
