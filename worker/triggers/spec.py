"""What a trigger is: its source, the filter that picks its events, and the run a picked
event starts (the harness, the templates and the run's other options)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.errors import InvalidInput
from worker.options.spec import LABEL_KEY, MAX_LABELS, parse_options
from worker.triggers.signatures import Source
from worker.triggers.template import check_template

TRIGGER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
TRIGGER_ID = re.compile(r"^trg[0-9a-f]{24}$")
NOT_IN_RUN = frozenset(
    {"harness", "labels", "archive", "archive_bytes", "producer", "key_slots", "attachments",
     "tenant", "webhook_url", "attempts", "input"}
)  # fmt: skip
"""Options a trigger's run does not take from its ``run``: the harness and labels are its
own fields, files are a producer's machine's, the producer and tenant are the trigger's."""


def new_trigger_id() -> str:
    return "trg" + secrets.token_hex(12)


class Filter(BaseModel):
    """Which events start a run; an empty filter takes every event."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: str | None = Field(default=None, pattern=r"^[a-z0-9_.-]{1,64}$")
    """GitHub's ``X-GitHub-Event`` (``issues``, ``issue_comment``, ``pull_request``), or a
    Standard Webhooks payload's ``type``."""
    action: str | None = Field(default=None, pattern=r"^[a-z0-9_.-]{1,64}$")
    """The payload's ``action`` (``labeled``, ``opened``, ``created``)."""
    label: str | None = Field(default=None, min_length=1, max_length=100)
    """The label that was added (the payload's ``label.name``)."""
    starts_with: str | None = Field(default=None, min_length=1, max_length=100)
    """The comment's text begins with this (the payload's ``comment.body``), as ``/agent``."""

    def refuses(self, event: str, payload: Mapping[str, Any]) -> str | None:
        """Why this event is not one to run (None: it is)."""
        if self.event is not None and event != self.event:
            return f"event {event[:64]!r} is not {self.event!r}"
        action = payload.get("action")
        if self.action is not None and action != self.action:
            return f"action {str(action)[:64]!r} is not {self.action!r}"
        if self.label is not None:
            label = payload.get("label")
            name = label.get("name") if isinstance(label, Mapping) else None
            if name != self.label:
                return f"label {str(name)[:100]!r} is not {self.label!r}"
        if self.starts_with is not None:
            comment = payload.get("comment")
            text = comment.get("body") if isinstance(comment, Mapping) else None
            if not isinstance(text, str) or not text.lstrip().startswith(self.starts_with):
                return f"the comment does not start with {self.starts_with!r}"
        return None


class TriggerSpec(BaseModel):
    """What the tenant (or operator) asks for: everything but the secret and the id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=TRIGGER_NAME.pattern)
    source: Source
    filter: Filter = Field(default_factory=Filter)
    harness: str = Field(max_length=64)
    input_template: str = Field(min_length=1)
    label_templates: dict[str, str] = Field(default_factory=dict)
    """Each run label's value, a template (``issue={issue.number}``); ``trigger`` is the
    trigger's name, always."""
    repo_from_payload: bool = False
    """The run's ``repo`` is the payload's ``repository.clone_url`` (under repo policy)."""
    run: dict[str, Any] = Field(default_factory=dict)
    """The run's other options, as ``harness run``'s (``start_run``'s names)."""

    @field_validator("input_template")
    @classmethod
    def _input(cls, value: str) -> str:
        return check_template(value)

    @field_validator("label_templates")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) >= MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS - 1} labels besides 'trigger'")
        for key, template in value.items():
            if not LABEL_KEY.fullmatch(key) or key == "trigger":
                raise ValueError(f"invalid label key {key[:80]!r} ('trigger' is the trigger's)")
            check_template(template, f"label template {key}")
        return value


class Trigger(TriggerSpec):
    """A stored trigger: its spec, whose it is, and the secret its deliveries are signed with."""

    id: str = Field(pattern=TRIGGER_ID.pattern)
    tenant: str = ""
    """The API tenant it belongs to; "" for one the operator made without a tenant."""
    secret: str
    created_at: float

    def public(self) -> dict[str, Any]:
        """Everything but the secret, which is masked."""
        shown = self.model_dump(mode="json", exclude={"secret"})
        shown["secret"] = self.secret[:4] + "…" if len(self.secret) > 8 else "…"
        return shown


def parse_spec(**fields: Any) -> TriggerSpec:
    """A valid spec, or InvalidInput naming what is not (its run options checked as a run's)."""
    try:
        spec = TriggerSpec(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "trigger"
        raise InvalidInput(
            f"invalid trigger: {where}: {first['msg'].removeprefix('Value error, ')}"
        ) from None
    named = sorted(set(spec.run) & NOT_IN_RUN)
    if named:
        raise InvalidInput(
            f"invalid trigger: run: {', '.join(named)} is not a trigger's run option"
        )
    if spec.repo_from_payload and spec.run.get("repo"):
        raise InvalidInput("invalid trigger: a repo, or the repo from the payload, not both")
    parse_options(harness=spec.harness, **spec.run)
    return spec
