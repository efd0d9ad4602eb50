"""The API's request and response bodies (strict: an unknown field is refused, 422)."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel, create_model

from adapters import events
from worker.options.spec import BUDGET_MAXIMA, RunOptions
from worker.store.records import RunRecord

_STRICT = ConfigDict(extra="forbid")
NOT_OVER_HTTP = ("harness", "archive", "archive_bytes", "producer", "key_slots")
"""Run options a request does not name among the others: ``harness`` is its own field, an
archive is a path on the client's machine (``harness run --archive``), not the API's, the
producer is the tenant (the turns waiting for a key's slots are served fairly across
tenants) and its key slots are its policy's."""


def _over_http(annotation: Any) -> Any:
    """A JSON list where the option holds a tuple."""
    if typing.get_origin(annotation) is tuple:
        return list[typing.get_args(annotation)[0]] | None  # type: ignore[misc]
    return annotation | None if type(None) not in typing.get_args(annotation) else annotation


def _run_options() -> dict[str, Any]:
    return {
        # The option's bounds too (info.metadata): out of range is 422, as every schema
        # mismatch (docs/api.md, "Errors"), and the OpenAPI document says them.
        name: (
            Annotated[_over_http(info.annotation), *info.metadata]
            if info.metadata
            else _over_http(info.annotation),
            Field(None, description=info.description),
        )
        for name, info in RunOptions.model_fields.items()
        if name not in NOT_OVER_HTTP
    }


RunOptionsBody: type[BaseModel] = create_model(
    "RunOptionsBody", __config__=_STRICT, **_run_options()
)
"""Every option of ``harness run`` by its long name with ``_`` (RunOptions, kept in step)."""


class RunCreate(RunOptionsBody):  # type: ignore[valid-type,misc]
    """``POST /v1/runs``: the harness, the first turn's input and the run's options."""

    model_config = _STRICT

    harness: str = Field(max_length=400)
    """A harness id; with ``attempts``, also ``a,b,...`` spread over the attempts (as
    ``model`` may be)."""
    input: str
    attempts: int | None = Field(None, ge=1, le=16)
    """Start this many runs side by side under one group (``harness run --attempts N``)."""
    labels: dict[str, str] | None = None
    webhook_url: str | None = Field(None, max_length=2000)


class RunCreated(BaseModel):
    run_id: str
    turn: int
    group: str | None = None
    """With ``attempts``: the group of the attempts; ``run_id`` is the first of ``runs``."""
    runs: list[str] | None = None


class AttemptDiff(BaseModel):
    files: int
    lines_added: int
    lines_removed: int


class AttemptRow(BaseModel):
    """One attempt of a group, as ``GET /v1/groups/{group}`` compares it."""

    index: int
    run_id: str
    status: str
    harness: str | None = None
    model: str | None = None
    turns: int | None = None
    outcome: str | None = None
    """``complete``, the ``reason`` of its last failed turn, or ``in-progress``."""
    answer: str | None = None
    structured: Any = None
    diff: AttemptDiff | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    wall_s: float | None = None


class Group(BaseModel):
    group: str
    picked: int | None
    attempts: list[AttemptRow]


class Pick(BaseModel):
    """``POST /v1/groups/{group}/pick``."""

    model_config = _STRICT

    attempt: int = Field(ge=1)


class Picked(BaseModel):
    group: str
    picked: int
    run_id: str
    ended: list[str]
    branch: str | None = None


class TurnCreate(BaseModel):
    model_config = _STRICT

    input: str
    output_schema: dict[str, Any] | None = None
    """This turn's JSON Schema for its answer, in place of the run's."""


class TurnAccepted(BaseModel):
    run_id: str
    turn: int


class Cancelled(BaseModel):
    run_id: str
    cancelled: bool


By = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="the platform's user who acts, recorded as ``api:TENANT:BY`` (without it "
        "``api:TENANT``; through a page link ``api:TENANT:link:LINK_ID``)",
    ),
]


class MessageIn(BaseModel):
    """``POST /v1/runs/{id}/messages``: a message to the run (``harness steer``)."""

    model_config = _STRICT

    text: str = Field(min_length=1)
    mode: Literal["queue", "steer", "interrupt"] = "queue"
    by: By = None
    """The platform's user who sends it: the ``user-message``'s ``by``."""


class ForkCreate(BaseModel):
    """``POST /v1/runs/{id}/fork``: a new run from the run's snapshot after turn ``at_turn``
    (default: its last finished turn), its conversation continued from there."""

    model_config = _STRICT

    input: str
    at_turn: int | None = Field(None, ge=0)
    harness: str | None = Field(None, max_length=64)
    model: str | None = Field(None, max_length=200)
    labels: dict[str, str] | None = None


class Forked(BaseModel):
    run_id: str
    forked_from: str
    forked_at_turn: int
    turn: int


class MessageSent(BaseModel):
    run_id: str
    message_id: str
    mode: Literal["queue", "steer", "interrupt"]
    turn: int
    state: Literal["sent-to-turn", "queued", "started"]
    """``sent-to-turn``: the running turn ``turn`` takes it; ``queued``: it waits for turn
    ``turn`` to end; ``started``: it is the input of the new turn ``turn``."""


class Decision(BaseModel):
    """``POST /v1/runs/{id}/permissions/{request_id}``."""

    model_config = _STRICT

    decision: Literal["allow", "deny"]
    always: bool = False
    message: str | None = Field(None, max_length=10_000)
    by: By = None
    """The platform's user who answers: the ``permission-decision``'s ``by``."""


class Rewind(BaseModel):
    model_config = _STRICT

    turn: int = Field(ge=0)


class BudgetChange(BaseModel):
    """``PATCH /v1/runs/{id}/budget``: limits to change (0 removes one); none: read it."""

    model_config = _STRICT

    max_cost_usd: float | None = Field(None, ge=0, le=BUDGET_MAXIMA["max_cost_usd"])
    max_tokens: int | None = Field(None, ge=0, le=BUDGET_MAXIMA["max_tokens"])
    max_turns: int | None = Field(None, ge=0, le=BUDGET_MAXIMA["max_turns"])
    max_wall_s: float | None = Field(None, ge=0, le=BUDGET_MAXIMA["max_wall_s"])


class RunPage(BaseModel):
    runs: list[RunRecord]
    cursor: str | None
    """The next page's cursor; null on the last."""


class Health(BaseModel):
    ok: bool


# -- responses -------------------------------------------------------------------------------
# The closed event set and the run record are the code's own models (adapters/events.py,
# worker/store/records.py): the document's schemas are generated from them, never copied.


def _event_data(event: type[BaseModel]) -> type[BaseModel]:
    """An event's ``data`` object: the event's fields but ``type``."""
    fields: dict[str, Any] = {
        name: (info.annotation, info) for name, info in event.model_fields.items() if name != "type"
    }
    return create_model(f"{event.__name__}Data", __doc__=event.__doc__, **fields)


def _event_entry(event: type[BaseModel], data: type[BaseModel]) -> type[BaseModel]:
    """One entry of a run's stream as the API returns it: id, type, data and time."""
    kind = event.model_fields["type"].default
    wire_type: Any = Literal[kind]
    return create_model(
        f"{event.__name__}Event",
        __doc__=f"A ``{kind}`` event: ``id`` is TURN-SEQ, ``ts`` unix time.",
        id=(str, ...),
        type=(wire_type, ...),
        data=(data, ...),
        ts=(float, ...),
    )


EVENT_MODELS: tuple[type[BaseModel], ...] = typing.get_args(typing.get_args(events.Event)[0])
"""The event classes of :data:`adapters.events.Event`, in its order."""
EVENT_DATA: dict[str, type[BaseModel]] = {m.__name__: _event_data(m) for m in EVENT_MODELS}
EVENT_ENTRIES: tuple[type[BaseModel], ...] = tuple(
    _event_entry(m, EVENT_DATA[m.__name__]) for m in EVENT_MODELS
)
_EventEntry: Any = Annotated[Union[EVENT_ENTRIES], Field(discriminator="type")]  # noqa: UP007


class Event(RootModel[_EventEntry]):
    """One event of a run's stream, by its ``type`` (docs/events.md, "Events")."""


WorkspaceChangeData = EVENT_DATA["WorkspaceChange"]
"""What a rewind returns: the data of the ``workspace`` event that records it."""


class RunStatusRecord(RunRecord):
    """The run record with what ``harness status --json`` adds to it."""

    credential_live: bool = False
    """Whether the run's scoped credential is still held."""
    waiting_for_worker: dict[str, Any] | None = None
    """While the current turn waits for a worker: ``{"notice": "waiting", "for": "turn",
    "run_id", "turn", "queue", "since", "bound_s"}``."""
    waiting_for_slot: dict[str, Any] | None = None
    """While the current turn waits for a key's concurrency slot: ``{"notice": "waiting",
    "for": "slot", "run_id", "turn", "grant", "place", "waiting", "limit", "since"}``."""
    silent_turn: dict[str, Any] | None = None
    """What the current turn's harness was doing when it had been silent for long."""


class PendingRequest(BaseModel):
    """A permission request waiting for its answer (``--posture ask``)."""

    request_id: str
    run_id: str
    turn: int
    n: int
    tool: str | None = None
    description: str
    command: str | None = None
    input: str | None = None
    """The tool's input as JSON text, masked, cut (``input_chars`` is its full length)."""
    input_chars: int | None = None
    deadline: float
    """Unix time at which an unanswered request is denied."""
    asked_at: float


class PermissionAnswer(BaseModel):
    """The answer as recorded (the ``permission-decision`` event repeats it)."""

    decision: Literal["allow", "deny"]
    scope: Literal["once", "always"]
    by: str
    message: str | None = None
    at: float


class Spent(BaseModel):
    cost_usd: float
    tokens: int
    turns: int
    wall_s: float


class Budget(BaseModel):
    """A run's budget (null: no limit), what it has spent, and what stopped it if anything."""

    run_id: str
    budget: dict[str, float | int | None]
    spent: Spent
    exceeded: dict[str, Any] | None = None
