"""The ``/v1/schedules`` routes (docs/api.md, "Schedules"): a tenant's schedules, each a run
the workers start on a cron. A schedule's name is its tenant's own: another tenant's answers
404, as an unknown one does."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from worker.api import schemas, webhooks
from worker.api.routes import TenantDep, _api, _errors
from worker.api.tenants import apply_policy

router = APIRouter()


class ScheduleCreate(schemas.RunOptionsBody):  # type: ignore[valid-type,misc]
    """``POST /v1/schedules``: the schedule's name, cron and time zone, and the run each
    firing starts (the options of ``POST /v1/runs``, without files)."""

    model_config = schemas._STRICT

    name: str = Field(max_length=63)
    cron: str = Field(max_length=200)
    """5 fields (minute hour day month weekday), or 6 with seconds first."""
    tz: str | None = Field(None, max_length=64)
    """An IANA time zone (default UTC): DST-correct wall-clock times."""
    harness: str = Field(max_length=64)
    input: str
    labels: dict[str, str] | None = None
    webhook_url: str | None = Field(None, max_length=2000)


class ScheduleView(BaseModel):
    name: str
    cron: str
    tz: str
    harness: str
    input: str
    options: dict[str, Any]
    labels: dict[str, str]
    paused: bool
    paused_reason: str | None = None
    failures: int
    """Firings that failed in a row (HARNESS_SCHEDULE_MAX_FAILURES of them pause it)."""
    next_at: float | None = None
    last_fired_at: float | None = None
    last_run_id: str | None = None
    last_error: str | None = None
    created_at: float


class ScheduleFiring(BaseModel):
    tick: int
    """The fire time it was for (Unix seconds)."""
    fired_at: float
    run_id: str | None = None
    error: str | None = None
    missed: bool | None = None
    """True when a later tick had passed too (fired once, late, for all of them)."""


@router.post(
    "/v1/schedules",
    status_code=201,
    response_model=ScheduleView,
    responses=_errors(409),
    operation_id="createSchedule",
)
async def create_schedule(request: Request, body: ScheduleCreate, tenant: TenantDep) -> Any:
    """Add a schedule (409 when the tenant has one of that name)."""
    api = _api(request)
    fields = body.model_dump(exclude_none=True)
    name, cron, tz = fields.pop("name"), fields.pop("cron"), fields.pop("tz", None)
    harness, text = fields.pop("harness"), fields.pop("input")
    webhook_url = fields.pop("webhook_url", None)
    options = apply_policy(tenant, harness, {**fields, "producer": tenant.name}, api.settings)
    if webhook_url:
        await run_in_threadpool(webhooks.check_url, webhook_url, api.settings)
    return await run_in_threadpool(
        functools.partial(
            api.client.add_schedule,
            name,
            cron,
            harness,
            text,
            tz=tz,
            tenant=tenant.name,
            webhook_url=webhook_url,
            watch=bool(webhook_url or tenant.webhook_url),
            **options,
        )
    )


@router.get(
    "/v1/schedules",
    response_model=list[ScheduleView],
    responses=_errors(),
    operation_id="listSchedules",
)
async def list_schedules(request: Request, tenant: TenantDep) -> Any:
    """The tenant's schedules, by name."""
    return await run_in_threadpool(_api(request).client.list_schedules, tenant=tenant.name)


@router.get(
    "/v1/schedules/{name}",
    response_model=ScheduleView,
    responses=_errors(404),
    operation_id="getSchedule",
)
async def get_schedule(request: Request, name: str, tenant: TenantDep) -> Any:
    return await run_in_threadpool(_api(request).client.get_schedule, name, tenant=tenant.name)


@router.delete(
    "/v1/schedules/{name}", status_code=204, responses=_errors(404), operation_id="removeSchedule"
)
async def remove_schedule(request: Request, name: str, tenant: TenantDep) -> Response:
    """Remove the schedule and its history (the runs it started stay)."""
    await run_in_threadpool(_api(request).client.remove_schedule, name, tenant=tenant.name)
    return Response(status_code=204)


@router.post(
    "/v1/schedules/{name}/pause",
    response_model=ScheduleView,
    responses=_errors(404),
    operation_id="pauseSchedule",
)
async def pause_schedule(request: Request, name: str, tenant: TenantDep) -> Any:
    return await run_in_threadpool(_api(request).client.pause_schedule, name, tenant=tenant.name)


@router.post(
    "/v1/schedules/{name}/resume",
    response_model=ScheduleView,
    responses=_errors(404),
    operation_id="resumeSchedule",
)
async def resume_schedule(request: Request, name: str, tenant: TenantDep) -> Any:
    """Active again from its next tick; its failures forgotten."""
    return await run_in_threadpool(_api(request).client.resume_schedule, name, tenant=tenant.name)


@router.get(
    "/v1/schedules/{name}/history",
    response_model=list[ScheduleFiring],
    responses=_errors(404),
    operation_id="scheduleHistory",
)
async def schedule_history(
    request: Request,
    name: str,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> Any:
    """The schedule's firings, newest first (HARNESS_SCHEDULE_HISTORY kept)."""
    return await run_in_threadpool(
        functools.partial(
            _api(request).client.schedule_history, name, tenant=tenant.name, limit=limit
        )
    )
