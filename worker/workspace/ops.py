"""Diff, export and rewind of a run's workspace, served by a worker on the run's host.

A producer anywhere sends a ``harness.workspace`` task to the run's host queue (only that
host has the workspace and its snapshots) and reads the reply from Redis in bounded chunks
(:mod:`worker.store.transfer`). Every refusal is a sentence in the reply, never a silent drop.

A rewind rewrites the workspace, so it runs only while the run is idle, holding the run's
workspace lock (a turn that starts meanwhile waits for it); it is recorded in the run's list
of rewinds, which the next turn publishes as ``workspace`` events after its ``turn-started``.
"""

from __future__ import annotations

import logging
from typing import Any, BinaryIO, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.base import SandboxError, SnapshotError
from worker.deps import TurnDeps
from worker.errors import RunNotFound
from worker.options.spec import RUN_ID
from worker.store.status import FINISHED, IN_FLIGHT
from worker.store.transfer import BinaryRedis, ReaderGone, ReplyWriter
from worker.workspace.steps import RunWorkspace, change_event, encode_rewind, run_workspace

log = logging.getLogger(__name__)

LOCK_TTL_S = 600


class ReplyAddress(BaseModel):
    """Where a request's reply goes: enough of it to answer one that is otherwise invalid."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: str = Field(pattern=RUN_ID.pattern)
    request_id: str = Field(pattern=r"^[0-9a-f]{8,64}$")


class WorkspaceRequest(ReplyAddress):
    """The task's one argument."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str = Field(pattern=r"^(diff|export|rewind)$")
    turn: int | None = Field(None, ge=0)
    from_turn: int | None = Field(None, ge=0)


def serve(deps: TurnDeps, raw: dict[str, Any], binary: BinaryRedis) -> str:
    """Answer one request into its reply key; returns a short outcome for logs and Flower."""
    try:
        request = WorkspaceRequest.model_validate(raw)
    except ValidationError as exc:
        return _refuse_invalid(deps, raw, exc, binary)
    writer = ReplyWriter(binary, deps.keys.reply(request.run_id, request.request_id))
    try:
        return _serve(deps, request, writer)
    except ReaderGone:
        log.info("workspace.reader_gone", extra={"run_id": request.run_id, "op": request.op})
        return "reader-gone"
    except (SnapshotError, SandboxError) as exc:
        writer.fail(str(exc))
        return f"refused:{request.op}"
    except RunNotFound:
        writer.fail(f"unknown run {request.run_id!r}")
        return "unknown-run"
    except Exception as exc:
        log.exception("workspace.internal_error", extra={"run_id": request.run_id})
        writer.fail(f"internal error of the worker: {type(exc).__name__}: {exc}")
        return "failed:internal"


def _refuse_invalid(deps: TurnDeps, raw: object, exc: ValidationError, binary: BinaryRedis) -> str:
    """Answer an invalid request with what is wrong with it (its reader would otherwise wait
    out its whole timeout). Only a request without a valid reply address goes unanswered:
    no reader can be waiting on a key that it does not name."""
    problems = "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'request'}: {error['msg']}"
        for error in exc.errors()
    )
    log.warning("workspace.bad_request", extra={"error": problems})
    try:
        address = ReplyAddress.model_validate(raw)
    except ValidationError:
        return "bad-request"
    writer = ReplyWriter(binary, deps.keys.reply(address.run_id, address.request_id))
    writer.fail(f"invalid request: {problems}")
    return "refused:bad-request"


def _serve(deps: TurnDeps, request: WorkspaceRequest, writer: ReplyWriter) -> str:
    record = deps.store.record(request.run_id)
    options = record.options
    if options is None:
        raise RunNotFound(request.run_id)
    sandbox = deps.sandbox_for(record.sandbox or deps.settings.sandbox)
    work = run_workspace(sandbox, request.run_id, options, deps.settings, tenant=record.tenant)
    taken = work.store.turns() if work.store.exists() else []
    if not taken:
        writer.fail(
            f"run {request.run_id} has no snapshot on this host (snapshots are taken after "
            "each turn; HARNESS_SNAPSHOTS may be off, or the run has ended)"
        )
        return f"refused:{request.op}"
    last = max(taken)
    turn = last if request.turn is None else request.turn
    if turn not in taken:
        writer.fail(
            f"run {request.run_id} has no snapshot after turn {turn} (it has turns "
            f"{_ranges(taken)})"
        )
        return f"refused:{request.op}"

    if request.op == "diff":
        start = turn - 1 if request.from_turn is None else request.from_turn
        if request.from_turn is None and request.turn is None:
            start = min(taken)
        if start not in taken:
            writer.fail(f"run {request.run_id} has no snapshot after turn {start}")
            return "refused:diff"
        for chunk in work.store.diff(start, turn):
            writer.write(chunk)
        writer.end({"from_turn": start, "to_turn": turn})
        return "diff"
    if request.op == "export":
        size = work.store.export(turn, cast(BinaryIO, writer), deps.settings.export_max_bytes)
        writer.end({"turn": turn, "bytes": size})
        return "export"
    return _rewind(deps, request, writer, work, turn, record.status, record.turns)


def _rewind(
    deps: TurnDeps,
    request: WorkspaceRequest,
    writer: ReplyWriter,
    work: RunWorkspace,
    turn: int,
    status: str,
    last_turn: int,
) -> str:
    run_id = request.run_id
    lock = deps.keys.workspace_lock(run_id)
    if status in IN_FLIGHT or status in FINISHED:
        writer.fail(f"run {run_id} is {status}: a rewind needs an idle run")
        return "refused:rewind"
    if not deps.redis.set(lock, request.request_id, nx=True, ex=LOCK_TTL_S):
        writer.fail(f"run {run_id} is being rewound already")
        return "refused:rewind"
    try:
        # Checked again under the lock: a turn sent meanwhile waits for the lock, and a
        # turn that began before it shows in the record.
        status = deps.store.record(run_id).status
        if status in IN_FLIGHT:
            writer.fail(f"run {run_id} is {status}: a rewind needs an idle run")
            return "refused:rewind"
        summary = work.store.restore(work.path, turn, work.uid, work.gid, as_turn=last_turn)
        deps.redis.rpush(deps.keys.rewinds(run_id), encode_rewind(summary))
        deps.store.update(run_id, snapshot=summary.snapshot)
    finally:
        deps.redis.delete(lock)
    log.info("workspace.rewound", extra={"run_id": run_id, "turn": turn})
    writer.end(change_event(summary).data())
    return "rewind"


def _ranges(turns: list[int]) -> str:
    return ", ".join(str(t) for t in sorted(turns)[:20]) + ("..." if len(turns) > 20 else "")
