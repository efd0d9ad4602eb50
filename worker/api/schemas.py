"""The API's request and response bodies (strict: an unknown field is refused, 422)."""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from worker.options.spec import BUDGET_MAXIMA, RunOptions

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
        name: (_over_http(info.annotation), Field(None, description=info.description))
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

    harness: str = Field(max_length=64)
    input: str
    labels: dict[str, str] | None = None
    webhook_url: str | None = Field(None, max_length=2000)


class RunCreated(BaseModel):
    run_id: str
    turn: int


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


class Decision(BaseModel):
    """``POST /v1/runs/{id}/permissions/{request_id}``."""

    model_config = _STRICT

    decision: Literal["allow", "deny"]
    always: bool = False
    message: str | None = Field(None, max_length=10_000)


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
    runs: list[dict[str, Any]]
    cursor: str | None


class Health(BaseModel):
    ok: bool
