"""The ``/v1`` routes (docs/api.md). Each is one client call."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from worker.api import links, openapi, schemas, sse, uploads, webhooks
from worker.api.errors import ERROR_RESPONSES, ApiError, not_found
from worker.api.limits import Verdict
from worker.api.tenants import Tenant, apply_policy, check_budget
from worker.options.spec import RUN_ID, parse_label
from worker.store import idempotency
from worker.store.event_ids import START, EventId, parse_event_id
from worker.store.records import RunRecord
from worker.store.status import RunStatus

router = APIRouter()
_bearer = HTTPBearer(auto_error=False, description="A tenant's API key")


def _api(request: Request) -> Any:
    return request.app.state.api


def _errors(*codes: int, ok: Any = None) -> dict[int | str, dict[str, Any]]:
    """The error statuses every authenticated route may answer, with ``codes``; ``ok``: the
    model of the 200 answer, for routes that return it unchecked (a record, events)."""
    # A route of one run (those that may say 404) may also refuse a page link's call, 403.
    link_refusal = {403} if 404 in codes else set()
    found: dict[int | str, dict[str, Any]] = {
        code: ERROR_RESPONSES[code]
        for code in sorted({400, 401, 413, 422, 429, 503, *codes, *link_refusal})
    }
    if ok is not None:
        found[200] = {"model": ok, "description": "OK"}
    return found


async def _tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """The tenant whose key the request bears, within its rate limit; a client address
    that sent too many wrong keys is refused (429) whatever key it bears, until its window
    ends."""
    api = _api(request)
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401, "unauthorized", "an Authorization: Bearer KEY header is needed", challenge
        )
    address = request.client.host if request.client else ""
    await _not_guessing_and_owner(request, api, address)
    bearer = credentials.credentials
    tenant: Tenant | None
    if links.is_token(bearer):
        route = getattr(request.scope.get("route"), "path", "")
        linked = await links.authenticate(
            api,
            bearer,
            request.method,
            route,
            request.path_params.get("run_id"),
            request.path_params.get("group"),
        )
        tenant = linked[0] if linked else None
        # Who answers through the page: the link, as the record of a decision says.
        request.state.link_id = linked[1].link_id if linked else None
    else:
        tenant = api.tenants.authenticate(bearer)
    if tenant is None:
        await api.auth_failures.failed(address)
        raise ApiError(401, "unauthorized", "unknown or revoked API key", challenge)
    request.state.tenant = tenant.name  # for the request's log line
    await within_rate(api, tenant)
    return tenant


async def not_guessing(api: Any, address: str, what: str) -> None:
    """429 for an address that sent too many wrong keys (or, at a trigger, bad signatures
    and unknown ids) in the window (HARNESS_API_FAILED_AUTH_LIMIT), whatever it bears now."""
    _refuse_guessing(await api.auth_failures.check(address), what)


async def _not_guessing_and_owner(request: Request, api: Any, address: str) -> None:
    """:func:`not_guessing` for wrong keys and, on a route of one run, that run's owner read
    in the same round trip, kept for :func:`_owned`: it decides on it only once the key is
    known to name a tenant, so nothing read here answers a request before its key is checked
    (a fault reading the owner is left for :func:`_owned` to meet again, after the key)."""
    run_id = request.path_params.get("run_id")
    if not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
        await not_guessing(api, address, "wrong keys")
        return
    pipe = api.pool.pipeline(transaction=False)
    judge = api.auth_failures.ask(pipe, address)
    pipe.hget(api.keys.run(run_id), "tenant")
    *guessed, owner = await pipe.execute(raise_on_error=False)
    for reply in guessed:
        if isinstance(reply, Exception):
            raise reply
    _refuse_guessing(judge(*guessed), "wrong keys")
    if not isinstance(owner, Exception):
        request.state.run_owner = (run_id, owner)


def _refuse_guessing(guessing: Verdict, what: str) -> None:
    if not guessing.allowed:
        raise ApiError(
            429,
            "rate_limited",
            f"too many {what} from this address; retry after {guessing.retry_after_s}s",
            {"Retry-After": str(guessing.retry_after_s)},
        )


async def within_rate(api: Any, tenant: Tenant) -> None:
    """429 for a tenant over its rate limit (the operator's and its own, the lower)."""
    limits = [n for n in (api.settings.api_rate_limit, tenant.rate_limit) if n]
    verdict = await api.limiter.hit(tenant.name, min(limits) if limits else 0)
    if not verdict.allowed:
        raise ApiError(
            429,
            "rate_limited",
            f"tenant {tenant.name} is over its rate limit; retry after {verdict.retry_after_s}s",
            {"Retry-After": str(verdict.retry_after_s)},
        )


TenantDep = Annotated[Tenant, Depends(_tenant)]

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=idempotency.KEY.pattern,
        description="a retry with this key within HARNESS_IDEMPOTENCY_TTL_S gets the first "
        f"answer and starts nothing ({idempotency.KEY_RULE})",
    ),
]


async def _still(api: Any, key: str, tenant: str, run_id: str) -> bool:
    """Whether ``key`` (or page link) still authenticates as ``tenant`` (the tenants file is
    read again when it changes: a revoked or rotated key stops here; an expired or deleted
    link too)."""
    found: Tenant | None
    if links.is_token(key):
        link = await links.find(api.pool, api.keys, run_id, key)
        found = links.holder(link, api.tenants) if link is not None else None
    else:
        found = api.tenants.authenticate(key)
    return found is not None and found.name == tenant


def _event_id(text: str | None) -> EventId:
    """An event id of a query or header (START when none): 400 unless Redis would take it."""
    return START if text is None else parse_event_id(text)


def _who(request: Request, tenant: Tenant, by: str | None) -> str:
    """Who acts, as the stream records it. The tenant's name leads, set here: a user named by
    the body cannot pass for another tenant, a rule or the worker; through a page link, the
    link, whatever the body says."""
    via_link = getattr(request.state, "link_id", None)
    user = f"link:{via_link}" if via_link else by
    return f"api:{tenant.name}" + (f":{user}" if user else "")


async def _owned(request: Request, run_id: str, tenant: Tenant) -> Any:
    """The API state, once the run is known to be ``tenant``'s (404 otherwise, alike for an
    unknown run and another tenant's)."""
    api = _api(request)
    if not RUN_ID.fullmatch(run_id):
        raise not_found(run_id)
    read = getattr(request.state, "run_owner", None)  # by the tenant's dependency, at once
    if read is not None and read[0] == run_id:
        owner = read[1]
    else:
        owner = await api.pool.hget(api.keys.run(run_id), "tenant")
    if owner != tenant.name:
        raise not_found(run_id)
    return api


# -- runs and turns -------------------------------------------------------------------------


@router.post(
    "/v1/runs",
    status_code=201,
    response_model=schemas.RunCreated,
    responses=_errors(409),
    openapi_extra=openapi.RUN_BODY,
    operation_id="createRun",
)
async def create_run(
    request: Request, tenant: TenantDep, idempotency_key: IdempotencyKey = None
) -> Any:
    """Start a run and its first turn (the run options of ``harness run``, as RunCreate).
    With a workspace archive: ``multipart/form-data``, a ``run`` part (that JSON) and an
    ``archive`` part (a tar, tar.gz or zip; at most HARNESS_ARCHIVE_MAX_BYTES, else 413)."""
    api = _api(request)
    async with uploads.run_request(request, api.settings) as (body, files):
        fields = body.model_dump(exclude_none=True)
        harness, text = fields.pop("harness"), fields.pop("input")
        attempts = fields.pop("attempts", None)
        webhook_url = fields.pop("webhook_url", None) or tenant.webhook_url
        producer = {**fields, "producer": tenant.name}
        if attempts is not None:
            group = await _start_attempts(api, tenant, harness, text, attempts, producer, files)
            if webhook_url:
                await run_in_threadpool(webhooks.check_url, webhook_url, api.settings)
                for run_id in group["runs"]:
                    await api.webhooks.watch(run_id)
            return {"run_id": group["runs"][0], "turn": 1, **group}
        options = apply_policy(tenant, harness, producer, api.settings)
        if files.archive is not None:
            options["archive"] = str(files.archive)
        if files.attachments:
            options["attachments"] = files.attachments
        if webhook_url:
            await run_in_threadpool(webhooks.check_url, webhook_url, api.settings)
        run_id = await run_in_threadpool(
            api.client.start_run,
            harness,
            text,
            **options,
            tenant=tenant.name,
            webhook_url=body.webhook_url,
            idempotency_key=idempotency_key,
        )
    if webhook_url:
        await api.webhooks.watch(run_id)
    return {"run_id": run_id, "turn": 1}


async def _start_attempts(
    api: Any,
    tenant: Tenant,
    harness: str,
    text: str,
    attempts: int,
    producer: dict[str, Any],
    files: Any,
) -> dict[str, Any]:
    """``attempts`` runs under one group, each harness of ``a,b`` within the tenant's policy
    (the options as the first one's policy fills them)."""
    names = [name.strip() for name in harness.split(",") if name.strip()]
    if not names:
        raise ApiError(422, "invalid_request", "harness: at least one harness id")
    options: dict[str, Any] = {}
    for name in names:
        options = apply_policy(tenant, name, producer, api.settings)
    if files.archive is not None:
        options["archive"] = str(files.archive)
    if files.attachments:
        options["attachments"] = files.attachments
    started: dict[str, Any] = await run_in_threadpool(
        lambda: api.client.start_attempts(
            names, text, attempts=attempts, **{**options, "tenant": tenant.name}
        )
    )
    return started


@router.get(
    "/v1/runs", response_model=None, responses=_errors(ok=schemas.RunPage), operation_id="listRuns"
)
async def list_runs(
    request: Request,
    tenant: TenantDep,
    status: Annotated[RunStatus | None, Query()] = None,
    label: Annotated[list[str] | None, Query(description="KEY=VALUE, repeatable")] = None,
    harness: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Annotated[str | None, Query(max_length=400)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Any:
    """The tenant's runs, newest first, a page at a time (``cursor`` from the last page)."""
    labels = dict(parse_label(text) for text in label or ())
    return await run_in_threadpool(
        _api(request).client.list_runs,
        status=status,
        labels=labels,
        harness=harness,
        limit=limit,
        cursor=cursor,
        tenant=tenant.name,
    )


@router.post(
    "/v1/runs/{run_id}/turns",
    status_code=202,
    response_model=schemas.TurnAccepted,
    responses=_errors(404, 409),
    openapi_extra=openapi.TURN_BODY,
    operation_id="submitTurn",
)
async def submit_turn(
    request: Request, run_id: str, tenant: TenantDep, idempotency_key: IdempotencyKey = None
) -> Any:
    """The run's next turn (409 while one is in flight, or once the run has ended). With
    files: ``multipart/form-data``, a ``turn`` part (that JSON) and ``attachment`` parts."""
    api = await _owned(request, run_id, tenant)
    async with uploads.turn_request(request, api.settings) as (body, files):
        turn = await run_in_threadpool(
            functools.partial(
                api.client.submit_turn,
                run_id,
                body.input,
                attachments=list(files.attachments) or None,
                output_schema=body.output_schema,
                idempotency_key=idempotency_key,
            )
        )
    return {"run_id": run_id, "turn": turn}


@router.get(
    "/v1/runs/{run_id}",
    response_model=None,
    responses=_errors(404, ok=schemas.RunStatusRecord),
    operation_id="getRun",
)
async def get_run(request: Request, run_id: str, tenant: TenantDep) -> dict[str, Any]:
    """The run record (``harness status --json``)."""
    api = await _owned(request, run_id, tenant)
    record: dict[str, Any] = await run_in_threadpool(api.client.status, run_id)
    return record


@router.get(
    "/v1/runs/{run_id}/events",
    response_model=None,
    responses=_errors(404, ok=list[schemas.Event]),
    operation_id="listEvents",
)
async def list_events(
    request: Request,
    run_id: str,
    tenant: TenantDep,
    after: Annotated[str | None, Query(max_length=48)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[dict[str, Any]]:
    """The run's events after the id ``after``, oldest first, at most ``limit``."""
    api = await _owned(request, run_id, tenant)
    _event_id(after)

    def read() -> list[dict[str, Any]]:
        found = []
        for event in api.client.events(run_id, after=after):
            found.append(event.as_dict())
            if len(found) >= limit:
                break
        return found

    events: list[dict[str, Any]] = await run_in_threadpool(read)
    return events


@router.get(
    "/v1/runs/{run_id}/events/stream",
    responses={
        **_errors(404),
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "Server-Sent Events: each message's ``id`` and ``event`` are an "
            "Event's ``id`` and ``type``, its ``data`` the Event's ``data`` (JSON)",
        },
    },
    response_class=Response,
    operation_id="streamEvents",
)
async def stream_events(
    request: Request,
    run_id: str,
    tenant: TenantDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    after: Annotated[str | None, Query(max_length=48)] = None,
    last_event_id: Annotated[str | None, Header(max_length=48)] = None,
) -> StreamingResponse:
    """The run's events as Server-Sent Events (``id:``, ``event:``, ``data:``), from after
    ``Last-Event-ID`` (or ``after``), until the run ends; a comment keeps it alive."""
    api = await _owned(request, run_id, tenant)
    cursor = _event_id(last_event_id or after or None)
    slot = api.streams.take(tenant.name)  # taken as checked: no other request runs between
    if slot is None:
        raise ApiError(
            429,
            "too_many_streams",
            f"tenant {tenant.name} holds {api.streams.most} open event streams on this "
            "server (HARNESS_API_STREAMS_PER_TENANT); close one first",
            {"Retry-After": "5"},
        )
    key = credentials.credentials if credentials else ""
    try:
        return sse.SlotResponse(
            sse.stream(
                api.hub,
                run_id,
                cursor,
                tenant=tenant.name,
                authorized=lambda: _still(api, key, tenant.name, run_id),
                keepalive_s=api.settings.api_keepalive_s,
                recheck_s=links.RECHECK_S if links.is_token(key) else sse.RECHECK_S,
            ),
            slot,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    except BaseException:
        slot.release()
        raise


@router.post(
    "/v1/runs/{run_id}/cancel",
    response_model=schemas.Cancelled,
    responses=_errors(404),
    operation_id="cancelRun",
)
async def cancel_run(request: Request, run_id: str, tenant: TenantDep) -> Any:
    """Stop the turn in flight (``cancelled`` false when none is)."""
    api = await _owned(request, run_id, tenant)
    cancelled = await run_in_threadpool(api.client.cancel, run_id)
    return {"run_id": run_id, "cancelled": cancelled}


@router.post(
    "/v1/runs/{run_id}/messages",
    status_code=202,
    response_model=schemas.MessageSent,
    responses=_errors(404, 409),
    operation_id="sendMessage",
)
async def send_message(
    request: Request, run_id: str, body: schemas.MessageIn, tenant: TenantDep
) -> Any:
    """Send a message to the run (``queue``, ``steer`` or ``interrupt``); 409 once it ended
    or when its budget refuses the turn the message would start."""
    api = await _owned(request, run_id, tenant)
    who = _who(request, tenant, body.by)
    return await run_in_threadpool(
        lambda: api.client.steer(run_id, body.text, mode=body.mode, by=who)
    )


@router.post(
    "/v1/runs/{run_id}/fork",
    status_code=201,
    response_model=schemas.Forked,
    responses=_errors(404, 409),
    operation_id="forkRun",
)
async def fork_run(
    request: Request, run_id: str, body: schemas.ForkCreate, tenant: TenantDep
) -> Any:
    """A new run of the tenant's from the run's snapshot after turn ``at_turn``, its
    conversation continued from there (the fork may run another harness or model, within
    the tenant's policy); its first turn starts with ``input``."""
    api = await _owned(request, run_id, tenant)

    def policy(harness: str, options: dict[str, Any]) -> dict[str, Any]:
        return apply_policy(tenant, harness, {**options, "producer": tenant.name}, api.settings)

    fork_id = await run_in_threadpool(
        lambda: api.client.fork(
            run_id,
            body.input,
            at_turn=body.at_turn,
            harness=body.harness,
            labels=body.labels,
            policy=policy,
            model=body.model,
        )
    )
    record = await run_in_threadpool(api.client.status, fork_id)
    return {
        "run_id": fork_id,
        "forked_from": run_id,
        "forked_at_turn": record["forked_at_turn"],
        "turn": 1,
    }


@router.delete(
    "/v1/runs/{run_id}",
    response_model=None,
    responses=_errors(404, ok=RunRecord),
    operation_id="endRun",
)
async def end_run(
    request: Request,
    run_id: str,
    tenant: TenantDep,
    wait: Annotated[float, Query(ge=0, le=120)] = 0,
) -> dict[str, Any]:
    """End the run (idempotent); with ``wait``, up to that many seconds for the teardown."""
    api = await _owned(request, run_id, tenant)
    record: dict[str, Any] = await run_in_threadpool(
        lambda: api.client.end(run_id, wait=wait > 0, timeout=wait or 60.0)
    )
    return record


# -- permission requests --------------------------------------------------------------------


@router.get(
    "/v1/runs/{run_id}/permissions",
    response_model=None,
    responses=_errors(404, ok=list[schemas.PendingRequest]),
    operation_id="listPermissions",
)
async def pending(request: Request, run_id: str, tenant: TenantDep) -> list[dict[str, Any]]:
    """The run's permission requests still waiting for an answer, oldest first."""
    api = await _owned(request, run_id, tenant)
    waiting: list[dict[str, Any]] = await run_in_threadpool(api.client.pending, run_id)
    return waiting


@router.post(
    "/v1/runs/{run_id}/permissions/{request_id}",
    response_model=None,
    responses=_errors(404, 409, ok=schemas.PermissionAnswer),
    operation_id="answerPermission",
)
async def answer(
    request: Request, run_id: str, request_id: str, body: schemas.Decision, tenant: TenantDep
) -> dict[str, Any]:
    """Allow or deny a waiting request; the first answer wins (409 for a later one)."""
    api = await _owned(request, run_id, tenant)
    who = _who(request, tenant, body.by)
    if body.decision == "allow":
        call = lambda: api.client.approve(run_id, request_id, always=body.always, by=who)  # noqa: E731
    else:
        call = lambda: api.client.deny(run_id, request_id, message=body.message, by=who)  # noqa: E731
    result: dict[str, Any] = await run_in_threadpool(call)
    return result


# -- groups of attempts ----------------------------------------------------------------------


@router.get(
    "/v1/groups/{group}",
    response_model=schemas.Group,
    responses=_errors(404),
    operation_id="getGroup",
)
async def get_group(request: Request, group: str, tenant: TenantDep) -> Any:
    """The group's attempts side by side: outcome, answer, structured result, diff stats,
    tokens, cost and wall time of each, and the attempt picked."""
    api = _api(request)
    found: dict[str, Any] = await run_in_threadpool(
        lambda: api.client.attempts(group, tenant=tenant.name)
    )
    return found


@router.get(
    "/v1/groups/{group}/diff",
    response_class=Response,
    responses=_errors(404),
    operation_id="diffAttempts",
)
async def diff_attempts(
    request: Request,
    group: str,
    tenant: TenantDep,
    a: Annotated[int, Query(ge=1, le=16)],
    b: Annotated[int, Query(ge=1, le=16)],
) -> Response:
    """A unified diff from attempt ``a``'s workspace to attempt ``b``'s."""
    api = _api(request)
    text: str = await run_in_threadpool(
        lambda: api.client.attempts_diff(group, a, b, tenant=tenant.name)
    )
    return Response(text, media_type="text/x-diff; charset=utf-8")


@router.post(
    "/v1/groups/{group}/pick",
    response_model=schemas.Picked,
    responses=_errors(404, 409),
    operation_id="pickAttempt",
)
async def pick_attempt(request: Request, group: str, body: schemas.Pick, tenant: TenantDep) -> Any:
    """Pick one attempt: the others are ended, it goes on as a normal run. The first pick
    wins (409 for another one later)."""
    api = _api(request)
    return await run_in_threadpool(lambda: api.client.pick(group, body.attempt, tenant=tenant.name))


# -- the workspace --------------------------------------------------------------------------


@router.get(
    "/v1/runs/{run_id}/diff",
    response_class=Response,
    responses={
        **_errors(404, 409),
        200: {"content": {"text/x-diff": {"schema": {"type": "string"}}}, "description": "OK"},
    },
    operation_id="getDiff",
)
async def diff(
    request: Request,
    run_id: str,
    tenant: TenantDep,
    turn: Annotated[int | None, Query(ge=1)] = None,
    from_turn: Annotated[int | None, Query(ge=0)] = None,
    to_turn: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """A unified diff of the workspace: turn ``turn``'s changes, or ``from_turn`` to
    ``to_turn``."""
    api = await _owned(request, run_id, tenant)
    text = await run_in_threadpool(
        lambda: api.client.diff(run_id, turn=turn, from_turn=from_turn, to_turn=to_turn)
    )
    return Response(text, media_type="text/x-diff")


@router.get(
    "/v1/runs/{run_id}/export",
    response_class=Response,
    responses={
        **_errors(404, 409),
        200: {
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
            "description": "OK",
        },
    },
    operation_id="exportRun",
)
async def export(
    request: Request,
    run_id: str,
    tenant: TenantDep,
    turn: Annotated[int | None, Query(ge=0)] = None,
) -> FileResponse:
    """A tar.gz of the workspace as it was after ``turn`` (default: the last)."""
    api = await _owned(request, run_id, tenant)
    folder = Path(tempfile.mkdtemp(prefix="harness-export-"))
    target = folder / f"{run_id}.tar.gz"
    try:
        await run_in_threadpool(lambda: api.client.export(run_id, target, turn=turn))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return FileResponse(
        target,
        media_type="application/gzip",
        filename=target.name,
        background=BackgroundTask(shutil.rmtree, folder, True),
    )


@router.post(
    "/v1/runs/{run_id}/rewind",
    response_model=None,
    responses=_errors(404, 409, ok=schemas.WorkspaceChangeData),
    operation_id="rewindRun",
)
async def rewind(
    request: Request, run_id: str, body: schemas.Rewind, tenant: TenantDep
) -> dict[str, Any]:
    """Put the workspace back as it was after ``turn`` (0: as seeded)."""
    api = await _owned(request, run_id, tenant)
    result: dict[str, Any] = await run_in_threadpool(api.client.rewind, run_id, body.turn)
    return result


@router.patch(
    "/v1/runs/{run_id}/budget",
    response_model=None,
    responses=_errors(404, 409, ok=schemas.Budget),
    operation_id="updateBudget",
)
async def budget(
    request: Request, run_id: str, body: schemas.BudgetChange, tenant: TenantDep
) -> dict[str, Any]:
    """Change the run's budget (0 removes a limit), within the operator's and the tenant's
    ceilings; returns it with what is spent."""
    api = await _owned(request, run_id, tenant)
    limits = body.model_dump(exclude_none=True)
    check_budget(tenant, limits)
    result: dict[str, Any] = await run_in_threadpool(
        lambda: api.client.set_budget(run_id, **limits)
    )
    return result


# -- page links -----------------------------------------------------------------------------


@router.post(
    "/v1/runs/{run_id}/links",
    status_code=201,
    response_model=links.LinkCreated,
    responses=_errors(404),
)
async def create_link(
    request: Request,
    run_id: str,
    body: links.LinkCreate,
    tenant: TenantDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Any:
    """A link to the run's page that opens it without the API key (``read``, or ``approve``
    to answer its permission requests too), for ``ttl_s`` seconds."""
    api = await _owned(request, run_id, tenant)
    most = api.settings.api_link_max_ttl_s
    if body.ttl_s > most:
        raise ApiError(
            422,
            "invalid_request",
            f"body.ttl_s: at most {most} (HARNESS_API_LINK_MAX_TTL_S)",
        )
    made_with = links.key_id(tenant, credentials.credentials if credentials else "")
    link, token = await links.create(api.pool, api.keys, run_id, tenant, made_with, body)
    path = f"/runs/{run_id}#link={token}&mode={link.mode}"
    return {
        "link_id": link.link_id,
        "run_id": run_id,
        "mode": link.mode,
        "expires_at": link.expires_at,
        "path": path,
        "url": str(request.base_url).rstrip("/") + path,
    }


@router.delete("/v1/runs/{run_id}/links/{link_id}", status_code=204, responses=_errors(404))
async def delete_link(request: Request, run_id: str, link_id: str, tenant: TenantDep) -> Response:
    """End the link at once (its page's open stream too); 404 when it is unknown or over."""
    api = await _owned(request, run_id, tenant)
    if not await links.revoke(api.pool, api.keys, run_id, link_id):
        raise ApiError(404, "not_found", f"no live link {link_id[:40]!r} of run {run_id}")
    return Response(status_code=204)


@router.get(
    "/v1/healthz",
    response_model=schemas.Health,
    responses={503: {"model": schemas.Health, "description": "Redis cannot be reached"}},
    operation_id="healthz",
)
async def healthz(request: Request) -> Any:
    """Whether this process reaches Redis (no key needed)."""
    try:
        await _api(request).pool.ping()
    except (redis.RedisError, OSError):  # not reached: "not ok", and nothing more is said
        return Response('{"ok":false}', 503, media_type="application/json")
    return {"ok": True}
