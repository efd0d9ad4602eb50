"""One inbound delivery, from its bytes to its answer: the signature checked, a replay
refused, the filter applied and the run's input, labels and repository made from the payload.
Starting the run is the caller's (the API: after the answer, within the tenant's policy)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.triggers import signatures
from worker.triggers.spec import Trigger
from worker.triggers.store import TriggerStore
from worker.triggers.template import label_value, lookup, render

REPO_FIELD = "repository.clone_url"


@dataclass(frozen=True)
class Start:
    """An accepted delivery's run, to start."""

    trigger: Trigger
    record_id: str
    input: str
    labels: dict[str, str]
    repo: str | None
    claims: tuple[str, ...]
    """The delivery ids it claimed: given back if the run is refused, so that the source may
    deliver it again once the cause is fixed."""


@dataclass(frozen=True)
class Receipt:
    """What to answer, and the run to start (accepted only)."""

    status_code: int
    answer: dict[str, Any]
    start: Start | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _event(trigger: Trigger, headers: Mapping[str, str], payload: Mapping[str, Any]) -> str:
    if trigger.source == "github":
        return next((v for k, v in headers.items() if k.lower() == "x-github-event"), "")[:64]
    kind = payload.get("type")
    return kind[:64] if isinstance(kind, str) else ""


def receive(
    store: TriggerStore, trigger: Trigger, headers: Mapping[str, str], body: bytes
) -> Receipt:
    size = len(body)
    try:
        signatures.verify(trigger.source, trigger.secret, headers, body)
    except signatures.BadSignature as exc:
        store.record(trigger.id, status="refused", reason=str(exc), size=size)
        return Receipt(
            401, {"error": {"type": "unauthorized", "message": "the signature does not verify"}}
        )
    delivery = signatures.delivery_id(trigger.source, headers, body)
    claims = [delivery]
    if trigger.source == "github":  # its delivery id is not signed: the body is
        claims.append("sha256:" + signatures.body_digest(body))
    claimed: list[str] = []
    for claim in dict.fromkeys(claims):
        if not store.first_time(trigger.id, claim):
            for mine in claimed:
                store.forget(trigger.id, mine)
            store.record(
                trigger.id, status="duplicate", reason="seen before", delivery=delivery, size=size
            )
            return Receipt(200, {"duplicate": True, "delivery_id": delivery})
        claimed.append(claim)
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return _refused(
            store, trigger, delivery, claimed, size, "the body is not a JSON object", status=400
        )
    event = _event(trigger, headers, payload)
    why = trigger.filter.refuses(event, payload)
    if why is not None:
        record_id = store.record(
            trigger.id, status="filtered", reason=why, delivery=delivery, event=event, size=size
        )
        return Receipt(202, {"id": record_id, "delivery_id": delivery, "status": "filtered"})
    context = payload  # a Standard Webhooks payload's fields are {data.KEY}
    repo = None
    if trigger.repo_from_payload:
        repo = lookup(context, REPO_FIELD) or None
        if repo is None:
            return _refused(store, trigger, delivery, claimed, size, f"no {REPO_FIELD}", event)
    labels = {key: label_value(render(t, context)) for key, t in trigger.label_templates.items()}
    labels["trigger"] = trigger.name
    record_id = store.record(
        trigger.id, status="accepted", delivery=delivery, event=event, size=size
    )
    start = Start(
        trigger, record_id, render(trigger.input_template, context), labels, repo, tuple(claimed)
    )
    return Receipt(202, {"id": record_id, "delivery_id": delivery, "status": "accepted"}, start)


def _refused(
    store: TriggerStore,
    trigger: Trigger,
    delivery: str,
    claimed: list[str],
    size: int,
    reason: str,
    event: str = "",
    *,
    status: int = 202,
) -> Receipt:
    for claim in claimed:
        store.forget(trigger.id, claim)
    record_id = store.record(
        trigger.id, status="refused", reason=reason, delivery=delivery, event=event, size=size
    )
    answer = {"id": record_id, "delivery_id": delivery, "status": "refused", "reason": reason}
    return Receipt(status, answer)
