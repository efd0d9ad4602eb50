"""Triggers over HTTP (docs/api.md, "Triggers"): a tenant's triggers managed with its key,
and their inbound URL, ``POST /v1/triggers/{id}``, which bears no key: a delivery proves
itself by its signature alone (worker/triggers/signatures.py).

A delivery is answered at once: 401 when its signature does not verify, 413 when its body is
over :data:`MAX_BODY_BYTES`, 200 ``{"duplicate": true}`` for a delivery id seen before, 202
when it is filtered out or accepted. An accepted delivery's run starts after the answer (a
background task, in the threadpool), within the trigger's tenant's policy, as ``POST
/v1/runs`` would start it; the delivery's record then holds the run, or why it did not start.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from worker.api import schemas
from worker.api.errors import ApiError
from worker.api.routes import TenantDep, _errors, not_guessing, within_rate
from worker.api.tenants import Tenant, apply_policy
from worker.errors import HarnessError, InvalidInput, Refused
from worker.triggers import inbound
from worker.triggers.signatures import SECRET_MAX_CHARS, Source
from worker.triggers.spec import TRIGGER_NAME, Filter, Trigger

log = logging.getLogger("worker.api.triggers")
router = APIRouter()

MAX_BODY_BYTES = 1024 * 1024
"""The largest delivery (GitHub sends at most 25 MB, but an issue's event is a few kB)."""


class TriggerCreate(BaseModel):
    """``POST /v1/triggers``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=TRIGGER_NAME.pattern)
    source: Source
    secret: str | None = Field(default=None, max_length=SECRET_MAX_CHARS)
    """The secret the source signs with; none: one is made and answered, this once."""
    filter: Filter | None = None
    harness: str = Field(max_length=64)
    input_template: str = Field(min_length=1)
    label_templates: dict[str, str] | None = None
    repo_from_payload: bool = False
    run: schemas.RunOptionsBody | None = None  # type: ignore[valid-type]


class TriggerShown(BaseModel):
    id: str
    name: str
    source: Source
    filter: Filter
    harness: str
    input_template: str
    label_templates: dict[str, str]
    repo_from_payload: bool
    run: dict[str, Any]
    tenant: str
    created_at: float
    secret: str | None
    """Masked, except in the answer that made it (and then only when it was made here)."""
    path: str


class TriggerList(BaseModel):
    triggers: list[TriggerShown]


class TriggerRemoved(BaseModel):
    id: str
    name: str
    removed: bool


class Delivery(BaseModel):
    id: str
    delivery_id: str
    received_at: float
    status: Literal["accepted", "filtered", "refused", "duplicate", "failed"]
    reason: str
    event: str
    size: int
    run_id: str | None


class DeliveryList(BaseModel):
    deliveries: list[Delivery]


class DeliveryReceipt(BaseModel):
    id: str | None = None
    delivery_id: str
    status: Literal["accepted", "filtered", "refused"] | None = None
    reason: str | None = None
    duplicate: bool | None = None


def _api(request: Request) -> Any:
    return request.app.state.api


def _not_found(trigger_id: str) -> ApiError:
    return ApiError(404, "not_found", f"unknown trigger {trigger_id[:40]!r}")


@router.post(
    "/v1/triggers",
    status_code=201,
    response_model=TriggerShown,
    responses=_errors(),
    operation_id="createTrigger",
)
async def create_trigger(request: Request, body: TriggerCreate, tenant: TenantDep) -> Any:
    """A trigger of the tenant's: its id, its inbound ``path`` and, when the body names no
    secret, the secret made for it (answered this once)."""
    api = _api(request)
    run: dict[str, Any] = body.run.model_dump(exclude_none=True) if body.run is not None else {}
    apply_policy(tenant, body.harness, {**run, "producer": tenant.name}, api.settings)
    made: dict[str, Any] = await run_in_threadpool(
        lambda: api.client.add_trigger(
            body.name,
            source=body.source,
            harness=body.harness,
            input_template=body.input_template,
            secret=body.secret,
            filter=body.filter,
            label_templates=body.label_templates,
            repo_from_payload=body.repo_from_payload,
            run=run,
            tenant=tenant.name,
        )
    )
    return made


@router.get(
    "/v1/triggers", response_model=TriggerList, responses=_errors(), operation_id="listTriggers"
)
async def list_triggers(request: Request, tenant: TenantDep) -> Any:
    """The tenant's triggers, by name; their secrets masked."""
    found = await run_in_threadpool(lambda: _api(request).client.list_triggers(tenant=tenant.name))
    return {"triggers": found}


def _owned(api: Any, trigger_id: str, tenant: Tenant) -> Trigger:
    trigger: Trigger | None = api.client.triggers.store.owned(trigger_id, tenant.name)
    if trigger is None:
        raise _not_found(trigger_id)
    return trigger


@router.delete(
    "/v1/triggers/{trigger_id}",
    response_model=TriggerRemoved,
    responses=_errors(404),
    operation_id="removeTrigger",
)
async def remove_trigger(request: Request, trigger_id: str, tenant: TenantDep) -> Any:
    """Remove the trigger and its deliveries' records: its URL answers 404 from now on."""
    api = _api(request)
    trigger = await run_in_threadpool(_owned, api, trigger_id, tenant)
    await run_in_threadpool(api.client.triggers.store.remove, trigger)
    return {"id": trigger.id, "name": trigger.name, "removed": True}


@router.get(
    "/v1/triggers/{trigger_id}/deliveries",
    response_model=DeliveryList,
    responses=_errors(404),
    operation_id="listTriggerDeliveries",
)
async def deliveries(
    request: Request,
    trigger_id: str,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> Any:
    """The trigger's deliveries, newest first (the last 200 within the retention)."""
    api = _api(request)
    trigger = await run_in_threadpool(_owned, api, trigger_id, tenant)
    found = await run_in_threadpool(api.client.triggers.store.deliveries, trigger.id, limit)
    return {"deliveries": found}


@router.post(
    "/v1/triggers/{trigger_id}",
    status_code=202,
    response_model=DeliveryReceipt,
    responses={
        **_errors(404),
        200: {"model": DeliveryReceipt, "description": "A delivery seen before: nothing done"},
    },
    operation_id="deliverTrigger",
)
async def deliver(request: Request, trigger_id: str) -> JSONResponse:
    """A delivery from the trigger's source, with no API key: its signature (GitHub's
    ``X-Hub-Signature-256``, or Standard Webhooks' ``webhook-*`` headers) is what proves it."""
    api = _api(request)
    address = request.client.host if request.client else ""
    await not_guessing(api, address, "refused deliveries")
    store = api.client.triggers.store
    trigger: Trigger | None = await run_in_threadpool(store.get, trigger_id)
    tenant = api.tenants.get(trigger.tenant) if trigger is not None and trigger.tenant else None
    if trigger is None or (trigger.tenant and (tenant is None or tenant.revoked)):
        await api.auth_failures.failed(address)  # a guessed id counts as a wrong key does
        raise _not_found(trigger_id)
    if tenant is not None:
        await within_rate(api, tenant)  # its deliveries count as its API calls do
    body = await _body(request)
    if body is None:
        size = int(request.headers.get("content-length") or 0)
        await run_in_threadpool(
            lambda: store.record(
                trigger.id, status="refused", reason="the body is too large", size=size
            )
        )
        raise ApiError(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    receipt = await run_in_threadpool(inbound.receive, store, trigger, dict(request.headers), body)
    if receipt.status_code == 401:
        await api.auth_failures.failed(address)
    start = receipt.start
    task = BackgroundTask(_start, api, tenant, start) if start is not None else None
    return JSONResponse(receipt.answer, receipt.status_code, background=task)


async def _body(request: Request) -> bytes | None:
    """The raw body (as signed), or None when it is over :data:`MAX_BODY_BYTES`."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)


async def _start(api: Any, tenant: Tenant | None, start: inbound.Start) -> None:
    """The accepted delivery's run, as ``POST /v1/runs`` starts one for the tenant."""
    run_id = await run_in_threadpool(_start_run, api, tenant, start)
    if run_id is not None and tenant is not None and tenant.webhook_url:
        await api.webhooks.watch(run_id)


def _start_run(api: Any, tenant: Tenant | None, start: inbound.Start) -> str | None:
    trigger, store = start.trigger, api.client.triggers.store
    options: dict[str, Any] = {**trigger.run, "labels": start.labels}
    if start.repo is not None:
        options["repo"] = start.repo
    try:
        if tenant is not None:
            options = apply_policy(
                tenant, trigger.harness, {**options, "producer": tenant.name}, api.settings
            )
        run_id: str = api.client.start_run(
            trigger.harness,
            start.input,
            **options,
            tenant=tenant.name if tenant is not None else None,
        )
    except (InvalidInput, Refused, HarnessError) as exc:
        status = "refused" if isinstance(exc, InvalidInput | Refused) else "failed"
        log.warning(
            "trigger.run_not_started",
            extra={"trigger": trigger.id, "delivery": start.record_id, "status": status},
        )
        store.settle(trigger.id, start.record_id, status, str(exc), None)
        for claim in start.claims:
            store.forget(trigger.id, claim)
        return None
    store.settle(trigger.id, start.record_id, "accepted", "", run_id)
    log.info("trigger.run_started", extra={"trigger": trigger.id, "run_id": run_id})
    return run_id
