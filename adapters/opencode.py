"""opencode: `opencode run --format json`, fixtures recorded with opencode-ai 1.18.33.

The one-shot mode. ``--posture ask`` runs ``opencode acp`` instead
(:mod:`adapters.opencode_acp`), with the same config (:func:`setup`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from adapters import coerce
from adapters.errors import classify
from adapters.events import (
    ActivityKind,
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

HARNESS_ID = "opencode"

CAPABILITIES = Capabilities(
    session_resume=True,
    system_prompt=True,
    permission_policy="full",
    permission_hooks=False,
    mid_turn_cancel=True,
    usage_reporting=True,
    cost_reporting=True,
    model_selection=True,
    model_reporting=False,  # 1.18.33 names no model in its stream
    mcp_client=True,
    mcp_ask=True,
    permission_ask=True,
    attachments="images",
    steering="ask-mode",
)

#: The provider id our config gives the endpoint of ``request.base_url``.
PROVIDER = "harness"
#: A step finishing for one of these reasons hands control back to opencode's loop.
_CONTINUING = frozenset({"tool-calls", "unknown"})
_FILE_TOOLS = frozenset({"edit", "write", "patch", "multiedit", "apply_patch"})
_KEY_PREFERENCE = ("OPENCODE_API_KEY", "OPENAI_API_KEY")
#: Pattern tool names (``Tool`` or ``Tool(spec)``, Claude's or opencode's) → permission keys.
_OWN = "bash edit read grep glob list webfetch websearch codesearch task todowrite todoread skill"
_PERMISSIONS = {
    **{name: name for name in (*_OWN.split(), "external_directory", "doom_loop")},
    **dict.fromkeys(("write", "multiedit", "patch", "notebookedit"), "edit"),
    "shell": "bash",
    "ls": "list",
}
#: strict: read-only, no network; auto: edits too; dangerous: everything. Always "deny",
#: never "ask": `opencode run` auto-rejects an ask and ends the whole turn there (1.18.33),
#: a deny fails only that call, and a tool denied outright is not offered to the model.
_GATED = ("bash", "webfetch", "websearch", "codesearch", "external_directory", "doom_loop")
_POSTURES: dict[str, dict[str, str]] = {
    "strict": {"edit": "deny", **dict.fromkeys(_GATED, "deny")},
    "auto": {"edit": "allow", **dict.fromkeys(_GATED, "deny")},
    "dangerous": {"*": "allow"},
}
#: ``--posture ask``: `opencode acp` (:mod:`adapters.opencode_acp`) hands every "ask" to us.
ASK_RULES = {"edit": "ask", **dict.fromkeys(_GATED, "ask")}
_PATTERN = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*(?:\((.*)\))?\s*$", re.S)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class State(AdapterState):
    offered_session: str | None
    priced: bool
    step_texts: list[str] = field(default_factory=list)
    last_reason: str | None = None
    rejected: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


def new_state(request: TurnRequest) -> State:
    # A model we describe ourselves (base_url) has no price: opencode reports 0 for it.
    return State(offered_session=request.resume_session, priced=request.base_url is None)


def _translate(pattern: str) -> tuple[str, str | None] | None:
    match = _PATTERN.match(pattern)
    if not match or match.group(1).lower() not in _PERMISSIONS:
        return None
    spec = match.group(2)
    if spec is not None and spec.endswith(":*"):  # Claude's prefix form `git status:*`
        spec = spec[:-2] + "*"
    return _PERMISSIONS[match.group(1).lower()], spec


def permission_config(request: TurnRequest) -> dict[str, Any]:
    """opencode's ``permission`` object: the posture, then the allows, then the denies
    (opencode applies the last rule that matches, so a deny wins)."""
    posture = ASK_RULES if request.posture == "ask" else _POSTURES[request.posture]
    rules: dict[str, Any] = dict(posture)
    for patterns, action in ((request.allow, "allow"), (request.deny, "deny")):
        for key, spec in filter(None, map(_translate, patterns)):
            if spec is None or spec.strip() in ("", "*"):
                rules[key] = action
                continue
            current = rules.get(key, rules.get("*", "allow"))
            table = dict(current) if isinstance(current, dict) else {"*": current}
            table.pop(spec, None)
            rules[key] = {**table, spec: action}
    return rules


def _key_env(request: TurnRequest) -> str | None:
    for name in _KEY_PREFERENCE:
        if name in request.granted_env:
            return name
    return min(request.granted_env) if request.granted_env else None


@dataclass(frozen=True)
class Setup:
    """What opencode is given in either mode: ``model`` as opencode names it (``-m``), the
    environment, the ``config`` the caller writes to ``config_path`` (it may add to it
    first) and the other ``files`` (a system prompt, named in the config)."""

    model: str | None
    env: dict[str, str]
    config: dict[str, Any]
    config_path: str
    files: dict[str, str]

    def all_files(self) -> dict[str, str]:
        return {**self.files, self.config_path: json.dumps(self.config, indent=2)}


def setup(request: TurnRequest) -> Setup:
    config_dir = f"{request.home}/.config/opencode"
    # Project config is disabled (a workspace opencode.json would override these
    # permissions, tests/fakemodel/clis.py); that also drops the workspace AGENTS.md, named here.
    instructions = [f"{request.workspace}/AGENTS.md"]
    files: dict[str, str] = {}
    if request.system_prompt:
        files[f"{config_dir}/harness-system-prompt.md"] = request.system_prompt
        instructions.append(f"{config_dir}/harness-system-prompt.md")
    config: dict[str, Any] = {
        "autoupdate": False,
        "share": "disabled",
        "instructions": instructions,
        "permission": permission_config(request),
    }
    if request.mcp_servers:
        # 1.18.33: a local server per attached one, its tools named SERVER_TOOL; the
        # credential passed on by name ({env:NAME} is substituted when the config loads).
        config["mcp"] = {
            server.name: {
                "type": "local",
                "command": list(server.command),
                "enabled": True,
                "environment": {name: "{env:" + name + "}" for name in server.env},
            }
            for server in request.mcp_servers
        }
        if request.posture == "ask":  # asked like any other tool (1.18.33 keys by tool name)
            config["permission"].update({f"{s.name}_*": "ask" for s in request.mcp_servers})
    model = request.model
    env = {
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "XDG_CONFIG_HOME": f"{request.home}/.config",  # where our opencode.json is read
    }
    if request.base_url:
        if not request.model:
            raise ValueError("opencode needs a model name to use a base URL (--model)")
        options = {"baseURL": request.base_url}
        key = _key_env(request)
        if key:  # the variable's name only: opencode substitutes {env:NAME} when it loads
            options["apiKey"] = "{env:" + key + "}"
        models = {request.model: {"name": request.model, **_vision(request)}}
        config["provider"] = {
            PROVIDER: {"npm": "@ai-sdk/openai-compatible", "options": options, "models": models}
        }
        env["OPENCODE_DISABLE_MODELS_FETCH"] = "1"  # models.dev knows nothing of our provider
        model = f"{PROVIDER}/{request.model}"
    return Setup(model, env, config, f"{config_dir}/opencode.json", files)


def _vision(request: TurnRequest) -> dict[str, Any]:
    # A configured model takes text only unless it says otherwise (1.18.33).
    if not any(a.image for a in request.attachments):
        return {}
    return {"attachment": True, "modalities": {"input": ["text", "image"], "output": ["text"]}}


def build_command(request: TurnRequest) -> Command:
    """The input goes on stdin, never in argv: opencode reads a piped stdin to EOF (no
    argv size limit, so 1 MiB works) and uses it verbatim as the message when argv has
    none, whereas argv words are re-joined and quoted when they hold spaces (1.18.33)."""
    found = setup(request)
    argv = [request.executable or "opencode", "run", "--format", "json"]
    if found.model:
        argv += ["-m", found.model]
    if request.resume_session:
        argv += ["--session", request.resume_session]
    # --file takes several values: one --file=PATH element each (an image becomes a file
    # part the model is sent as an image).
    argv += [f"--file={request.workspace}/{a.path}" for a in request.attachments if a.image]
    stdin = request.input.encode("utf-8")
    return Command(tuple(argv), stdin, found.env, found.all_files(), request.workspace)


def _retry_after(headers: dict[str, Any]) -> float | None:
    lower = {str(k).lower(): coerce.text(v).strip() for k, v in headers.items()}
    if lower.get("retry-after-ms", "").isdigit():
        return int(lower["retry-after-ms"]) / 1000
    seconds = lower.get("retry-after", "")
    return float(seconds) if seconds.replace(".", "", 1).isdigit() else None


def _error(message: dict[str, Any]) -> Event:
    error = coerce.mapping(message.get("error"))
    data = coerce.mapping(error.get("data"))
    name = coerce.text(error.get("name")) or "error"
    text = coerce.text(data.get("message")) or name
    status = 401 if name == "ProviderAuthError" else data.get("statusCode")
    status = status if isinstance(status, int) else None
    delay = _retry_after(coerce.mapping(data.get("responseHeaders")))
    found = classify(f"{text} {coerce.text(data.get('responseBody'))}", status, retry_after_s=delay)
    retryable = found.retryable
    if found.reason == "harness-error" and isinstance(data.get("isRetryable"), bool):
        retryable = data["isRetryable"]  # opencode gives up only after its own retries
    where = f" (HTTP {status})" if status else ""
    error_text = f"opencode {name}{where}: {text}"
    return session_error(
        error_text, found.reason, retryable=retryable, retry_after_s=found.retry_after_s
    )


def _activity(part: dict[str, Any]) -> SandboxActivity:
    tool = coerce.text(part.get("tool")) or "tool"
    state = coerce.mapping(part.get("state"))
    args = coerce.mapping(state.get("input"))
    kind: ActivityKind = "tool"
    description = f"{tool} {coerce.text(state.get('title'))}"
    if tool == "bash":
        kind, description = "command", coerce.text(args.get("command"))
    elif tool in _FILE_TOOLS:
        path = coerce.text(args.get("filePath")) or coerce.text(state.get("title"))
        kind, description = "file", f"{tool} {path}"
    if state.get("status") == "error":  # only terminal states are printed: completed or error
        reason = (coerce.text(state.get("error")).strip().splitlines() or ["error"])[0]
        description += f" (failed: {reason[:200]})"
    return SandboxActivity(kind=kind, description=description.strip() or tool)


def _usage(part: dict[str, Any], state: State) -> Usage:
    tokens = coerce.mapping(part.get("tokens"))
    cache = coerce.mapping(tokens.get("cache"))
    cost = part.get("cost")
    usage = Usage(
        # opencode's input leaves out cache reads and writes, its output the reasoning.
        input_tokens=coerce.count(tokens.get("input"))
        + coerce.count(cache.get("read"))
        + coerce.count(cache.get("write")),
        output_tokens=coerce.count(tokens.get("output")) + coerce.count(tokens.get("reasoning")),
        cached_input_tokens=coerce.count(cache.get("read")),
        cost_usd=float(cost) if state.priced and isinstance(cost, int | float) else None,
    )
    state.input_tokens += usage.input_tokens
    state.output_tokens += usage.output_tokens
    if usage.cost_usd is not None:
        state.cost_usd = (state.cost_usd or 0.0) + usage.cost_usd
    return usage


def map_message(message: dict[str, Any], state: State) -> list[Event]:
    events: list[Event] = []
    session_id = message.get("sessionID")  # on every line
    if state.session_id is None and isinstance(session_id, str) and session_id:
        state.session_id = session_id
        events.append(Session(session_id=session_id, resumed=session_id == state.offered_session))
    kind, part = message.get("type"), coerce.mapping(message.get("part"))
    if kind == "step_start":
        state.step_texts, state.last_reason = [], None
    elif kind == "text" and coerce.text(part.get("text")):  # a whole text part, not a delta
        state.step_texts.append(part["text"])
        events.append(AssistantText(text=part["text"]))
    elif kind == "tool_use":
        activity = _activity(part)
        events.append(activity)
        tool_state = coerce.mapping(part.get("state"))
        # An "ask" that `opencode run` auto-rejected: the turn ends after it, with exit 0.
        if "rejected permission" in coerce.text(tool_state.get("error")):
            state.rejected = activity.description
            command = coerce.text(coerce.mapping(tool_state.get("input")).get("command")) or None
            call_id = coerce.text(part.get("callID"))
            events.append(PermissionRequest(request_id=call_id, description=state.rejected,
                                            command=command))  # fmt: skip
    elif kind == "step_finish":
        state.last_reason = coerce.text(part.get("reason")) or None
        events.append(_usage(part, state))
    elif kind == "error":  # printed once opencode has given up; it then exits 1
        events.append(_error(message))
    return events


def finish(state: State, exit: ExitInfo) -> list[Event]:
    """1.18.33 prints no final message, so the turn is decided here, at exit. A step that
    finished with ``stop`` is not final on its own (after an automatic compaction the
    summary step ends with ``stop`` and the loop goes on), and a turn cut short by a
    rejected permission exits 0 too: success is exit 0 after a final step."""
    stderr = _ANSI.sub("", exit.stderr_tail)
    if exit.exit_code == 0 and state.last_reason and state.last_reason not in _CONTINUING:
        text = "\n".join(state.step_texts)  # the answer: the text of the last step
        return [TurnComplete(text=text, session_id=state.session_id, model=None, exit_code=0,
                             input_tokens=state.input_tokens, output_tokens=state.output_tokens,
                             cost_usd=state.cost_usd)]  # fmt: skip
    if state.offered_session and "Session not found" in stderr:
        state.resume_rejected = True
        error = f"opencode could not resume {state.offered_session}: no such session"
        return [session_error(error, "harness-error", exit_code=exit.exit_code, stderr_tail=stderr)]
    if exit.exit_code == 0 and state.rejected:
        error = f"opencode ended the turn after rejecting a permission: {state.rejected}"
        return [session_error(error, "harness-error", exit_code=0, stderr_tail=stderr)]
    return []


def policy_warning(request: TurnRequest) -> str | None:
    unknown = [p for p in (*request.allow, *request.deny) if _translate(p) is None]
    if not unknown:
        return None
    return (
        "opencode applies the posture and the other patterns, but these name no opencode "
        f"permission and are not applied: {', '.join(unknown)}"
    )
