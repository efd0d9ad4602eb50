"""What every adapter provides (:class:`Adapter`, :class:`Mode`), and the values passed to and
from it.

An adapter is pure: it turns a :class:`TurnRequest` into a :class:`Command` (argv, stdin,
environment names and values that are not secret, config files to place in the run's HOME)
and maps the harness's JSON messages into events. It never spawns, reads the environment,
touches the filesystem or looks at a clock; the sandbox places the command and the worker
feeds the output back through :mod:`adapters.stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from adapters.asks import Ask, Decision
from adapters.events import Event

Posture = Literal["strict", "auto", "dangerous", "ask"]
"""``ask``: what the allow/deny rules do not settle is asked of a person or a service, live
(adapters with capability ``permission_ask``; see :mod:`adapters.asks`)."""
PermissionPolicy = Literal["full", "posture-only", "none"]
AttachmentChannel = Literal["images", "files", "none"]
"""How a harness takes a turn's attachments: ``images`` through its own image input (the model
sees the pixels; other files are named in the input), ``files`` as files in the workspace named
in the input (read with its own tools), ``none`` not at all."""
SteerChannel = Literal["native", "ask-mode", "emulated"]
"""How a harness takes a message in the middle of its turn (``harness steer --mode steer``):
``native`` on its own input channel in every posture, ``ask-mode`` on the channel of its ask
mode (``--posture ask``) and emulated otherwise, ``emulated`` never: the worker then stops the
turn as a cancel does and the message starts the next turn in the same vendor session."""
StructuredChannel = Literal["native", "prompt"]
"""How a harness is given a turn's output schema: ``native`` by its own schema option,
``prompt`` through its system-prompt channel. The worker validates the answer in both."""


@dataclass(frozen=True)
class Attachment:
    """One file a producer attached to a turn, already in the run's workspace.

    ``path`` is relative to the workspace (``.attachments/turn-N/NAME``); ``media_type`` is
    what the worker found in its bytes (``image/png``, ``image/jpeg``, ``image/gif``,
    ``image/webp``) or ``application/octet-stream``. ``data`` holds an image's bytes for a
    harness whose image channel carries them inline (Claude Code's stream-json image blocks);
    empty for other files.
    """

    path: str
    media_type: str
    size: int
    data: bytes = b""

    @property
    def image(self) -> bool:
        return self.media_type.startswith("image/")


@dataclass(frozen=True)
class TurnRequest:
    """Everything an adapter may know when it builds one turn's command.

    Paths are as the harness sees them inside its sandbox (``/workspace`` in a container).
    ``granted_env`` holds only the *names* of granted variables: values never reach adapters.
    """

    input: str
    turn: int = 1
    workspace: str = "/workspace"
    home: str = "/workspace/.home"
    model: str | None = None
    system_prompt: str | None = None
    posture: Posture = "auto"
    mcp_servers: tuple[McpServer, ...] = ()
    """The MCP servers attached to the run (``--tools``, ``--mcp``), each to be loaded the
    harness's own way for this turn; empty: none, and the adapter configures none."""
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    resume_session: str | None = None
    base_url: str | None = None
    executable: str | None = None
    granted_env: frozenset[str] = frozenset()
    carry: Mapping[str, Any] = field(default_factory=dict)
    """What this adapter's previous turn of the run left in ``state.carry`` (JSON-able), for
    example a thread's running usage totals. Empty on a run's first turn."""
    attachments: tuple[Attachment, ...] = ()
    output_schema: Mapping[str, Any] | None = None
    """The JSON Schema the turn's final answer must meet: an adapter whose capability
    ``structured_output`` is ``native`` hands it to the harness's own schema option (the
    worker puts it in the system prompt of the others, and validates every answer)."""


@dataclass(frozen=True)
class Command:
    """One harness invocation, as data.

    ``stdin`` is written to the process and then closed; ``None`` closes stdin at once.
    ``env`` holds non-secret variables only (granted secrets are added by the sandbox).
    ``files`` maps absolute paths inside the sandbox (under ``home`` or ``workspace``) to
    contents the sandbox writes before the process starts.
    """

    argv: tuple[str, ...]
    stdin: bytes | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    keep_stdin: bool = False
    """Keep stdin open after ``stdin`` for the whole turn: the worker writes what the mapper
    puts in ``state.outbox`` (answers to permission requests, protocol replies) and closes
    it once the turn has its terminal event."""


@dataclass(frozen=True)
class ExitInfo:
    """How the harness process ended, given to ``finish`` when its stream closes."""

    exit_code: int | None
    stderr_tail: str = ""


@dataclass(frozen=True)
class McpServer:
    """One MCP server attached to a run, as its harness launches it: a stdio server (the
    worker's bridge to the run's endpoint, :mod:`worker.tools.bridge`). ``env`` names
    variables of the harness's own environment the server needs (the run's credential):
    a config passes them on by name, never by value."""

    name: str
    command: tuple[str, ...]
    env: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    """The server's tool names as the worker listed them when the turn began, for a harness
    that must name each tool it may use (pi's ``--tools``)."""


@dataclass(frozen=True)
class Capabilities:
    """What an adapter really implements (docs/adapters.md, "Capabilities")."""

    session_resume: bool
    system_prompt: bool
    permission_policy: PermissionPolicy
    permission_hooks: bool
    mid_turn_cancel: bool
    usage_reporting: bool
    cost_reporting: bool
    model_selection: bool
    model_reporting: bool
    mcp_client: bool
    permission_ask: bool = False
    """The harness can hand a permission decision to us live (``--posture ask``)."""
    mcp_ask: bool = False
    """Under ``--posture ask`` the harness asks for each call of an attached MCP tool on its
    own channel; where false, the run's MCP endpoint asks before it makes the call."""
    attachments: AttachmentChannel = "files"
    structured_output: StructuredChannel = "prompt"
    model_gateway: bool = True
    """The harness's model requests can be sent through the worker's model gateway (its base
    URL and key settings take a loopback URL and a stand-in): its model key never enters its
    sandbox. Where false, a granted model key is refused (worker/gateway/turn.py)."""
    steering: SteerChannel = "emulated"
    """Where a ``steer`` message reaches the running turn on the harness's own channel
    (``queue`` and ``interrupt`` are the worker's, for every harness)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_resume": self.session_resume,
            "system_prompt": self.system_prompt,
            "permission_policy": self.permission_policy,
            "permission_hooks": self.permission_hooks,
            "mid_turn_cancel": self.mid_turn_cancel,
            "usage_reporting": self.usage_reporting,
            "cost_reporting": self.cost_reporting,
            "model_selection": self.model_selection,
            "model_reporting": self.model_reporting,
            "mcp_client": self.mcp_client,
            "permission_ask": self.permission_ask,
            "mcp_ask": self.mcp_ask,
            "attachments": self.attachments,
            "structured_output": self.structured_output,
            "model_gateway": self.model_gateway,
            "steering": {"queue": "emulated", "steer": self.steering, "interrupt": "emulated"},
        }


@dataclass(kw_only=True)
class AdapterState:
    """One turn's mapping state: what every adapter's ``State`` holds (each adds its own
    fields) and what the worker reads after the turn.

    ``resume_rejected`` is set when the harness refused the offered session (stale or
    unknown id): the worker then retries fresh with the run's prior conversation replayed.
    ``carry`` is persisted in the run record and handed to the next turn as
    ``TurnRequest.carry``.
    """

    session_id: str | None = None
    model: str | None = None
    resume_rejected: bool = False
    carry: dict[str, Any] = field(default_factory=dict)
    asks: list[Ask] = field(default_factory=list)
    """Permission requests the mapper found that wait for an answer (``--posture ask``): the
    worker takes them, publishes them and calls the adapter's ``answer`` with the decision."""
    outbox: list[bytes] = field(default_factory=list)
    """Bytes for the harness's stdin (a ``keep_stdin`` command), written and emptied by the
    worker after every feed and answer."""


StateT = TypeVar("StateT", bound=AdapterState)


class Mode(Protocol[StateT]):
    """One CLI mode of a harness, as a module (``adapters/<module>.py``) whose ``State`` is
    ``StateT``: how a turn is invoked and how its output is mapped. The state ``new_state``
    makes is the one its mapper is given back. A mode that asks nothing of us (a one-shot
    mapper) needs no more; :class:`Adapter` is a mode that can also answer and be steered."""

    HARNESS_ID: str
    CAPABILITIES: Capabilities

    def new_state(self, request: TurnRequest) -> StateT: ...

    def build_command(self, request: TurnRequest) -> Command: ...

    def map_message(self, message: dict[str, Any], state: StateT) -> list[Event]: ...

    def finish(self, state: StateT, exit: ExitInfo) -> list[Event]: ...

    def policy_warning(self, request: TurnRequest) -> str | None: ...


@runtime_checkable
class TextMessages(Protocol):
    """What a mode may add for a flood of text lines: ``text_message(message)``, the text of a
    message its mapper turns into exactly one ``assistant-text`` event (``""`` when it turns
    it into none), None for any other message. It reads no state and changes none, so a
    stream driver that merges text (:attr:`adapters.stream.StreamDriver.coalesce_chars`)
    takes such a line's text without making an event of it; the mapper reads a text message
    with the same function."""

    def text_message(self, message: dict[str, Any]) -> str | None: ...


class Adapter(Mode[StateT], Protocol[StateT]):
    """Everything the worker calls on a harness's adapter (``adapters.get``): a mode, and
    ``answer``, which the worker calls with the decision on each :class:`~adapters.asks.Ask`
    the mapper left in ``state.asks``; it appends the harness's reply to ``state.outbox``."""

    def answer(self, state: StateT, ask: Ask, decision: Decision) -> None: ...

    def steer(self, state: StateT, text: str) -> bool:
        """Hand a person's message to the running turn on the harness's own channel: append
        its line to ``state.outbox`` and return True; False when this turn's mode has no such
        channel (the worker then emulates it, :data:`SteerChannel`)."""
        ...
