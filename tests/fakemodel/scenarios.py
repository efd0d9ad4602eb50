"""Scenarios, fixed answers and the reading of a request's conversation, shared by all APIs.

A request's scenario is the server's default unless the current turn's prompt carries a
marker ``[scenario:NAME]``. Other markers: ``[delay:SECONDS]`` (chunk delay for ``slow``) and
``[answer-model:NAME]`` (the model the response claims answered).

The "current turn" is everything after the last assistant text that follows a user prompt:
the prompt of this CLI invocation plus any tool calls and results made since. A marker in an
earlier, resumed turn does not leak into the next one; a tool result in the current turn
means the tool scenario's call was answered and the final text is due.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

SCENARIOS: tuple[str, ...] = (
    "text",
    "tool",
    "edit",
    "http-429",
    "http-401",
    "quota",
    "http-500",
    "slow",
    "truncated",
    "forbidden",
    "mcp",
    "structured",
    "structured-invalid",
    "held",
)

TEXT_ANSWER = "Hello from the fake model."
"""The whole answer of the ``text`` and ``slow`` scenarios."""

FORBIDDEN_DONE = "forbidden-attempts-done"
"""What the ``forbidden`` scenario's command prints last (its attempts are the server's
``forbidden_command``: see tests/e2e/test_egress.py)."""

TOOL_COMMAND = "echo tool-ran-$((6*7))"
"""The shell command of the ``tool`` scenario; it prints ``tool-ran-42``."""
TOOL_OUTPUT = "tool-ran-42"
EDIT_COMMAND = "echo agent-line >> README.md && echo made-by-agent > agent.txt && echo edit-ran"
"""The shell command of the ``edit`` scenario: it changes README.md, adds agent.txt (in the
harness's working directory, the workspace) and prints ``edit-ran``."""
HELD_READY = "held-ready"
HELD_GO = "held-go"
HELD_COMMAND = (
    f"touch {HELD_READY}; timeout 60 sh -c 'until [ -e {HELD_GO} ]; do sleep 0.1; done'; "
    "echo held-ran"
)
"""The shell command of the ``held`` scenario: it creates ``held-ready`` in the harness's
working directory, then waits (up to 60 s) until ``held-go`` exists there and prints
``held-ran``. A test acts on the running turn between the two (a steer message). No command
substitution: gemini refuses a command with one under ``--approval-mode default``."""
TOOL_DESCRIPTION = "Print the tool marker"
TOOL_FINAL_PREFIX = "Done. The command printed: "
"""The ``tool`` scenario's final answer is this prefix plus the tool result's text (trimmed)."""

MCP_SERVER = "orders"
"""The ``mcp`` scenario's tool set (attached with ``--tools orders``) and its tool, called
with :data:`MCP_ARGUMENTS`; the final answer is :data:`MCP_FINAL_PREFIX` plus the result."""
MCP_TOOL = "lookup"
MCP_ARGUMENTS: dict[str, Any] = {"order_id": 7}
MCP_FINAL_PREFIX = "The order tool said: "
MCP_TOOL_NAMES: tuple[str, ...] = (
    f"mcp__{MCP_SERVER}__{MCP_TOOL}",  # claude-code
    f"mcp_{MCP_SERVER}_{MCP_TOOL}",  # gemini
    f"{MCP_SERVER}_{MCP_TOOL}",  # opencode, pi (our extension)
    MCP_TOOL,  # codex, in the namespace mcp__orders
)
TOOL_SEARCH = "ToolSearch"
"""Claude Code 2.1.328 defers MCP tools: the model selects one with this tool first."""

TRUNCATED_TEXT = "This answer stops in the mid"
"""What the ``truncated`` scenario streams before it drops the connection."""

STRUCTURED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["ok"]},
        "images": {"type": "array", "items": {"type": "string"}},
        "schema_offered": {"type": "boolean"},
    },
    "required": ["verdict", "images", "schema_offered"],
    "additionalProperties": False,
}
"""The output schema the ``structured`` scenarios are tested with. Its property
``schema_offered`` is the marker: the request offered the schema when its name is in it."""
STRUCTURED_TOOL = "StructuredOutput"
"""Claude Code's tool for ``--json-schema`` (2.1.328): the answer is the call's input."""


def structured_answer(conversation: Conversation, valid: bool) -> dict[str, Any]:
    """What the ``structured`` scenario answers: the SHA-256 of every image the request
    carried and whether it offered the schema; ``structured-invalid`` breaks the schema
    (``verdict`` a number)."""
    return {
        "verdict": "ok" if valid else 42,
        "images": [hashlib.sha256(image).hexdigest() for image in conversation.images],
        "schema_offered": conversation.schema_offered,
    }


def images_in(body: Any) -> list[bytes]:
    """The images a request carries, in any API's form: Anthropic ``image`` blocks
    (``source.data``), OpenAI ``data:image/...;base64,`` URLs (Responses ``input_image``,
    Chat ``image_url``), Gemini ``inlineData``. Each once, in order."""
    found: list[bytes] = []

    def add(text: str) -> None:
        with contextlib.suppress(binascii.Error, ValueError):
            data = base64.b64decode(text, validate=True)
            if data not in found:
                found.append(data)

    def walk(value: Any) -> None:
        if isinstance(value, str):
            if value.startswith("data:image/") and ";base64," in value:
                add(value.split(";base64,", 1)[1])
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            kind = value.get("media_type") or value.get("mimeType") or value.get("mime_type")
            if (
                isinstance(kind, str)
                and kind.startswith("image/")
                and isinstance(value.get("data"), str)
            ):
                add(value["data"])
            for item in value.values():
                walk(item)

    walk(body)
    return found


def schema_offered(body: Any) -> bool:
    """Whether the request carries :data:`STRUCTURED_SCHEMA` (its marker property), in a
    system prompt, a tool's parameters or a response format."""
    return "schema_offered" in json.dumps(body)


RETRY_AFTER_S = 7
"""The ``retry-after`` header of the ``http-429`` scenario."""

DEFAULT_SLOW_DELAY_S = 0.5
SLOW_CHUNKS = 4


@dataclass(frozen=True)
class FixedUsage:
    """Token usage every successful response reports.

    ``input_tokens`` is the whole prompt, ``cached_input_tokens`` the part of it read from a
    cache. How each API spells it:

    - Anthropic: ``input_tokens`` = 100 (uncached only), ``cache_read_input_tokens`` = 20,
      ``cache_creation_input_tokens`` = 0, ``output_tokens`` = 30.
    - OpenAI Responses: ``input_tokens`` = 120, ``input_tokens_details.cached_tokens`` = 20,
      ``output_tokens`` = 30, ``total_tokens`` = 150.
    - Chat Completions: ``prompt_tokens`` = 120, ``prompt_tokens_details.cached_tokens`` = 20,
      ``completion_tokens`` = 30, ``total_tokens`` = 150.
    - Gemini: ``promptTokenCount`` = 120, ``cachedContentTokenCount`` = 20,
      ``candidatesTokenCount`` = 30, ``totalTokenCount`` = 150.
    """

    input_tokens: int = 120
    cached_input_tokens: int = 20
    output_tokens: int = 30

    @property
    def uncached_input_tokens(self) -> int:
        return self.input_tokens - self.cached_input_tokens

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


USAGE = FixedUsage()

_MARKER = re.compile(r"\[(scenario|delay|final-delay|answer-model):([^\]\s]+)\]")


@dataclass(frozen=True)
class Item:
    """One piece of a conversation, API-independent."""

    role: str  # "user", "assistant" or "system"
    kind: str  # "text", "tool_call" or "tool_result"
    text: str = ""


@dataclass
class Conversation:
    items: list[Item]
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Offered tools as ``{"name": ..., "parameters": <JSON schema or {}>}``."""
    images: list[bytes] = field(default_factory=list)
    """The images the request carries (:func:`images_in`), set by the server."""
    schema_offered: bool = False

    def current_turn(self) -> list[Item]:
        """The items of the turn this request belongs to (see the module docstring)."""
        seen_prompt = False
        start = 0
        for index in range(len(self.items) - 1, -1, -1):
            item = self.items[index]
            if item.role == "user" and item.kind == "text":
                seen_prompt = True
            elif item.role == "assistant" and item.kind == "text" and seen_prompt:
                start = index + 1
                break
        return self.items[start:]

    def prompt_text(self) -> str:
        return "\n".join(
            i.text for i in self.current_turn() if i.role == "user" and i.kind == "text"
        )

    def tool_results(self) -> list[str]:
        """Tool results given back to the model in the current turn."""
        return [i.text for i in self.current_turn() if i.kind == "tool_result"]

    def mcp_tool(self) -> dict[str, Any] | None:
        """The ``mcp`` scenario's tool among those offered, by any CLI's name for it."""
        for tool in self.tools:
            namespace = tool.get("namespace")
            if tool.get("name") in MCP_TOOL_NAMES[:3] or (
                namespace == f"mcp__{MCP_SERVER}" and tool.get("name") == MCP_TOOL
            ):
                return tool
        return None

    def mcp_result(self) -> str | None:
        """The result of the ``mcp`` scenario's call in the current turn, once it came."""
        called = False
        for item in self.current_turn():
            if item.kind == "tool_call":
                called = '"order_id"' in item.text
            elif item.kind == "tool_result" and called:
                return item.text
        return None

    def shell_tool(self) -> dict[str, Any] | None:
        by_name = {t.get("name"): t for t in self.tools}
        for name in SHELL_TOOL_NAMES:
            if name in by_name:
                return by_name[name]
        return None


SHELL_TOOL_NAMES: tuple[str, ...] = (
    "Bash",  # claude-code
    "run_shell_command",  # gemini
    "bash",  # opencode, pi
    "exec_command",  # codex with a model it knows (string "cmd")
    "shell_command",  # codex (string "command")
    "shell",  # codex with fallback metadata (argv "command")
)


def shell_arguments(tool: dict[str, Any], command: str = TOOL_COMMAND) -> dict[str, Any]:
    """Arguments for ``tool`` that run ``command``, shaped after its parameter schema."""
    props = tool.get("parameters", {}).get("properties", {}) or {}
    args: dict[str, Any] = {}
    if "cmd" in props:
        args["cmd"] = command
    elif props.get("command", {}).get("type") == "array":
        args["command"] = ["bash", "-lc", command]
    else:
        args["command"] = command
    if "description" in props:
        args["description"] = TOOL_DESCRIPTION
    return args


@dataclass(frozen=True)
class Choice:
    """What the server decided to do with one request."""

    scenario: str
    delay_s: float
    answer_model: str | None
    final_delay_s: float = 0.0
    """``[final-delay:SECONDS]``: the tool scenarios wait this long before the final answer
    (the request that carries the tool's result), so a test can act between the two."""


def choose(conversation: Conversation, default: str, delay_s: float, model: str | None) -> Choice:
    """The scenario for a request: markers in the current prompt win over the defaults."""
    scenario, delay, answer_model, final_delay = default, delay_s, model, 0.0
    for key, value in _MARKER.findall(conversation.prompt_text()):
        if key == "scenario" and value in SCENARIOS:
            scenario = value
        elif key == "delay":
            with contextlib.suppress(ValueError):
                delay = float(value)
        elif key == "final-delay":
            with contextlib.suppress(ValueError):
                final_delay = float(value)
        elif key == "answer-model":
            answer_model = value
    return Choice(scenario, delay, answer_model, final_delay)


_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def final_tool_text(results: list[str]) -> str:
    # Claude Code 2.1.328 appends <system-reminder> blocks to tool results: not tool output.
    text = _REMINDER.sub("", results[-1]).strip() if results else ""
    return TOOL_FINAL_PREFIX + text[:200]


def text_of(value: Any) -> str:
    """Text inside a content value: a string, a list of text blocks, or anything nested."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (text_of(v) for v in value) if t)
    if isinstance(value, dict):
        for key in ("text", "content", "output", "result"):
            if key in value:
                return text_of(value[key])
    return ""
