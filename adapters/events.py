"""The closed event set published to a run's stream (docs/events.md, "Events").

Each event is a frozen pydantic model whose ``type`` field is the wire type; everything
else is the event's ``data``. ``events.schema.json`` beside this file is generated from
these models and kept in sync by a test; regenerate it with
``python -m adapters.events > adapters/events.schema.json``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)
from pydantic_core import PydanticSerializationError

ActivityKind = Literal["command", "file", "tool", "network", "model", "other"]
"""``model``: what the model gateway did with a model request (a fallback, a refusal)."""
UsageSource = Literal["harness", "replay", "gateway", "grader"]
"""``harness``: what the CLI reported; ``replay``: a transcript replayed into a fresh session
(estimated); ``gateway``: the model API's own count of one request, read at the model gateway
(beside the harness's, never added to it); ``grader``: what the run's outcome grader spent
judging the turn (a run of its own, counted in this run's totals and budget)."""
ErrorReason = Literal[
    "rate-limited",
    "quota",
    "auth",
    "harness-error",
    "exit",
    "timeout",
    "cancelled",
    "shutdown",
    "worker-lost",
    "sandbox",
    "invalid-input",
    "internal",
    "budget",
    "invalid-output",
]

#: Default ``retryable`` per reason, as docs/events.md's reason table states it.
RETRYABLE_BY_DEFAULT: dict[str, bool] = {
    "rate-limited": True,
    "quota": False,
    "auth": False,
    "harness-error": False,
    "exit": True,
    "timeout": True,
    "cancelled": False,
    "shutdown": True,
    "worker-lost": True,
    "sandbox": True,
    "invalid-input": False,
    "internal": True,
    "budget": False,
    "invalid-output": False,
}


def utf8_safe(text: str) -> str:
    """``text`` with lone surrogates replaced, so that it can be encoded as UTF-8.

    A harness line may carry an escaped lone surrogate ("\\ud800"): valid JSON, but no UTF-8
    exists for it, and Redis would refuse the whole batch.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


_WIRE_TYPE = {"type"}
WORKSPACE_LIST_LIMIT = 200
"""At most this many paths per list of a ``workspace`` event (the counts are complete)."""


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @property
    def terminal(self) -> bool:
        return False

    def data(self) -> dict[str, Any]:
        """The event's ``data`` object: every field but ``type``."""
        return self.model_dump(mode="json", exclude={"type"})

    def data_json(self) -> str:
        """``data()`` as compact JSON (non-ASCII kept), as the stream carries it.

        Serialised by pydantic-core straight from the model (about a fifth of the cost of
        ``model_dump`` then ``json``: this runs once per published event). A float that is
        not finite becomes ``null``, so the result is always valid JSON. Text with a lone
        surrogate (no UTF-8 exists for it) makes pydantic-core refuse; that rare event takes
        the slow path, which replaces the surrogate.
        """
        try:
            return self.__pydantic_serializer__.to_json(self, exclude=_WIRE_TYPE).decode()
        except PydanticSerializationError:
            return utf8_safe(json.dumps(self.data(), ensure_ascii=False, separators=(",", ":")))


class TurnStarted(_Event):
    """The turn's first event. ``trace_id`` (32 hex digits) names the OpenTelemetry trace of
    the turn when the worker traces (``OTEL_EXPORTER_OTLP_ENDPOINT`` set); it is left out of
    the data otherwise."""

    type: Literal["turn-started"] = "turn-started"
    harness: str
    attempt: int = 1
    input_chars: int
    trace_id: str | None = None

    @model_serializer(mode="wrap")
    def _trace_id_only_when_traced(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.trace_id is None:
            data.pop("trace_id", None)
        return data


class Session(_Event):
    type: Literal["session"] = "session"
    session_id: str
    resumed: bool
    model: str | None = None


class AssistantText(_Event):
    type: Literal["assistant-text"] = "assistant-text"
    text: str

    def data_json(self) -> str:
        """As :meth:`_Event.data_json`, byte for byte, at half its cost: the one event a
        flood is made of. orjson escapes a string exactly as pydantic-core does (checked
        over every code point by a test); a lone surrogate, which orjson refuses, takes the
        general path."""
        try:
            return orjson.dumps({"text": self.text}).decode()
        except orjson.JSONEncodeError:
            return super().data_json()


class SandboxActivity(_Event):
    """What the harness did in its sandbox. Kind ``network`` is a connection the egress
    gateway refused (published by the worker after the turn's work): ``host``, ``port`` and
    ``denied`` are set for it, and left out of the data of every other kind."""

    type: Literal["sandbox-activity"] = "sandbox-activity"
    kind: ActivityKind
    description: str
    host: str | None = None
    port: int | None = None
    denied: bool | None = None

    @model_serializer(mode="wrap")
    def _network_fields_only_for_network(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.kind != "network":
            for name in _NETWORK_FIELDS:
                data.pop(name, None)
        return data


_NETWORK_FIELDS = ("host", "port", "denied")


class PermissionRequest(_Event):
    """The harness asked for something the posture gates. With ``--posture ask`` it waits
    for the answer (``deadline`` set, a ``permission-decision`` follows); otherwise it is
    told.

    ``input`` is the tool's input as JSON text, granted values masked, cut at
    :data:`PERMISSION_INPUT_LIMIT` characters (``input_chars`` is its full length).
    """

    type: Literal["permission-request"] = "permission-request"
    request_id: str
    description: str
    command: str | None = None
    tool: str | None = None
    input: str | None = None
    input_chars: int | None = None
    deadline: float | None = None
    """Unix time at which an unanswered request is denied."""


PERMISSION_INPUT_LIMIT = 2000


class PermissionDecision(_Event):
    """How a waiting ``permission-request`` was answered, and by whom: a person or a service
    (the identity given with the answer), or the worker itself (``worker:deadline``,
    ``worker:cancelled``, ``worker:shutdown``, ``worker:turn-ended``, ``worker:channel``) or a
    run rule (``rule:always``)."""

    type: Literal["permission-decision"] = "permission-decision"
    request_id: str
    decision: Literal["allow", "deny"]
    scope: Literal["once", "always"] = "once"
    by: str
    message: str | None = None


class ToolCall(_Event):
    """The harness called a tool of the run's MCP endpoint (a producer's tool set attached
    with ``--tools``, or an operator's server attached with ``--mcp``). ``input`` is the
    call's arguments as JSON text, secret-looking fields and granted values masked, cut at
    :data:`TOOL_TEXT_LIMIT` characters (``input_chars`` is its full length)."""

    type: Literal["tool-call"] = "tool-call"
    call_id: str
    server: str
    tool: str
    input: str
    input_chars: int


class ToolResult(_Event):
    """How a ``tool-call`` ended: ``ok`` false for an error result (the handler raised, no
    server answered by the deadline, the call was refused). ``output`` is what the harness
    got, cut at :data:`TOOL_TEXT_LIMIT` characters (``output_chars`` is its full length)."""

    type: Literal["tool-result"] = "tool-result"
    call_id: str
    ok: bool
    output: str
    output_chars: int
    duration_ms: int


TOOL_TEXT_LIMIT = 2000


class WorkspaceChange(_Event):
    """What a turn changed in its workspace, from the worker's snapshot after the turn.

    Path lists are cut at :data:`WORKSPACE_LIST_LIMIT` entries each; the ``*_count`` fields
    are the full counts. ``rewound_to`` is set on the event that records a rewind (published
    at the start of the next turn, after its ``turn-started``).
    """

    type: Literal["workspace"] = "workspace"
    snapshot: str
    added: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    added_count: int = 0
    modified_count: int = 0
    deleted_count: int = 0
    lines_added: int = 0
    lines_removed: int = 0
    large: tuple[str, ...] = ()
    complete: bool = True
    note: str | None = None
    rewound_to: int | None = None
    pushed_branch: str | None = None


class Usage(_Event):
    type: Literal["usage"] = "usage"
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = None
    source: UsageSource = "harness"
    model: str | None = None
    """Source ``gateway``: the model that served the request, as the API's answer names it
    (left out of the data of other sources)."""

    @model_serializer(mode="wrap")
    def _model_only_when_known(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.model is None:
            data.pop("model", None)
        return data


class Parked(_Event):
    """Not terminal: the turn met a rate limit or a quota and the worker sends its input again
    as the run's next turn (``next_turn``) at ``resume_at`` (unix time); its terminal follows."""

    type: Literal["parked"] = "parked"
    resume_at: float
    reason: ErrorReason
    next_turn: int


SteerMode = Literal["queue", "steer", "interrupt"]
"""How a person's message reaches a run (``harness steer --mode``): ``queue`` as the next turn
once the current one ends, ``steer`` into the running turn, ``interrupt`` by stopping the
running turn and starting the next with the message."""
Delivery = Literal["native", "emulated", "next-turn"]
"""How a message was delivered: ``native`` on the harness's own channel mid-turn, ``emulated``
(a ``steer`` the harness could not take mid-turn: the turn was stopped and the message starts
the next one), ``next-turn`` as (part of) the input of the turn it starts."""


class UserMessage(_Event):
    """Not terminal: a person's (or a service's) message to the run, in order with the turn's
    events: published by the turn it reached (mid-turn for ``native``/``emulated``) or, for
    ``next-turn``, right after the ``turn-started`` of the turn whose input it is."""

    type: Literal["user-message"] = "user-message"
    text: str
    mode: SteerMode
    by: str
    delivery: Delivery
    message_id: str


class OutcomeEvaluation(_Event):
    """Not terminal: the run's grader judged this turn's result against its ``--outcome``
    rubric (iteration ``iteration`` of at most ``--max-iterations``). ``grader_run_id`` is the
    grader's own run; its spend is also this turn's ``usage`` of source ``grader``."""

    type: Literal["outcome-evaluation"] = "outcome-evaluation"
    iteration: int
    satisfied: bool
    feedback: str
    grader_run_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


class TurnComplete(_Event):
    type: Literal["turn-complete"] = "turn-complete"
    text: str
    session_id: str | None = None
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    exit_code: int | None = None
    structured: dict[str, Any] | list[Any] | str | int | float | bool | None = None
    """With an output schema: the answer as the JSON value the worker validated against it
    (an adapter whose harness returns it apart from the text sets it; the worker fills it
    from the text otherwise). Left out of the data without a schema."""

    @model_serializer(mode="wrap")
    def _structured_only_with_a_schema(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.structured is None:
            data.pop("structured", None)
        return data

    @property
    def terminal(self) -> bool:
        return True


class SessionError(_Event):
    type: Literal["session-error"] = "session-error"
    error: str
    reason: ErrorReason
    retryable: bool
    retry_after_s: float | None = None
    exit_code: int | None = None
    stderr_tail: str = ""

    @property
    def terminal(self) -> bool:
        return True


Event = Annotated[
    TurnStarted
    | Session
    | AssistantText
    | SandboxActivity
    | PermissionRequest
    | PermissionDecision
    | ToolCall
    | ToolResult
    | WorkspaceChange
    | Usage
    | Parked
    | UserMessage
    | OutcomeEvaluation
    | TurnComplete
    | SessionError,
    Field(discriminator="type"),
]

EVENT_TYPES: tuple[str, ...] = (
    "turn-started",
    "session",
    "assistant-text",
    "sandbox-activity",
    "permission-request",
    "permission-decision",
    "tool-call",
    "tool-result",
    "workspace",
    "usage",
    "parked",
    "user-message",
    "outcome-evaluation",
    "turn-complete",
    "session-error",
)
TERMINAL_TYPES = frozenset({"turn-complete", "session-error"})

_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def session_error(
    error: str,
    reason: ErrorReason,
    *,
    retryable: bool | None = None,
    retry_after_s: float | None = None,
    exit_code: int | None = None,
    stderr_tail: str = "",
) -> SessionError:
    """A ``session-error`` whose ``retryable`` defaults to the contract's rule for ``reason``."""
    if retryable is None:
        retryable = RETRYABLE_BY_DEFAULT[reason]
    return SessionError(
        error=error,
        reason=reason,
        retryable=retryable,
        retry_after_s=retry_after_s,
        exit_code=exit_code,
        stderr_tail=stderr_tail,
    )


def parse_event(event_type: str, data: dict[str, Any]) -> Event:
    """Rebuild a typed event from its wire form (``type`` + ``data``); raises on anything else."""
    return _adapter.validate_python({"type": event_type, **data})


def json_schema() -> dict[str, Any]:
    return _adapter.json_schema()


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
