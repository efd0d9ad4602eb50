"""Celery tasks: decode the payload, call a function that knows nothing of Celery."""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from typing import Any

from celery import Task
from celery.signals import (
    celeryd_after_setup,
    setup_logging,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from adapters.events import session_error
from config import get_settings
from sandbox.base import SandboxError
from worker import runtime
from worker.app import app, direct_queue
from worker.app_names import (
    TASK_END_RUN,
    TASK_REAP,
    TASK_REAP_HOST,
    TASK_RUN_TURN,
    TASK_WORKSPACE,
)
from worker.errors import InvalidSettings, RunNotFound
from worker.fleet import host_queues, hosts, lifecycle
from worker.observe import logs, metrics, tracing
from worker.options.spec import TurnPayload
from worker.schedules import firing
from worker.store.errors import REDIS_ERRORS
from worker.store.terminal import TurnRef, end_unclaimed_turn
from worker.turn.execute import execute_turn
from worker.workspace import ops as workspace_ops
from worker.workspace import steps as workspace_steps

log = logging.getLogger(__name__)

_stops: list[threading.Event] = []
_heartbeats: list[hosts.Heartbeat] = []

DOCKER_START_WAIT_S = 30.0
"""How long a starting Docker worker waits for its daemon (which may be starting too)."""


@app.task(name=TASK_RUN_TURN, bind=True, acks_late=True, max_retries=30)
def run_turn(self: Task, payload: dict[str, Any]) -> str:
    turn = TurnPayload.model_validate(payload)
    deps = runtime.deps()
    try:
        with logs.context(run_id=turn.run_id, turn=turn.turn):
            return execute_turn(deps, turn, delivery=self.request.id)
    except REDIS_ERRORS as exc:
        # Redis unreachable before the turn was claimed: nothing happened yet, try again.
        raise self.retry(exc=exc, countdown=2) from exc
    except Exception as exc:
        # Before the claim (a claimed turn is ended by execute_turn on every path): the
        # turn cannot be taken as it is, so it ends here with the worker's error.
        log.exception("turn.internal_error", extra={"run_id": turn.run_id, "turn": turn.turn})
        try:
            harness = deps.store.raw(turn.run_id).get("harness", "")
        except RunNotFound:
            return "unknown-run"
        ref = TurnRef(
            deps.redis, deps.keys, deps.store, deps.settings, turn.run_id, turn.turn, harness
        )
        problem = f"internal error of the worker: {type(exc).__name__}: {exc}"
        end_unclaimed_turn(ref, session_error(problem, "internal"), caller="unclaimed")
        return "failed:internal"


@app.task(name=TASK_END_RUN, acks_late=True)
def end_run(run_id: str) -> bool:
    return lifecycle.end_run(runtime.deps(), run_id)


@app.task(name=TASK_WORKSPACE)
def workspace(request: dict[str, Any]) -> str:
    """Diff, export or rewind of a run's workspace; the reply goes through Redis."""
    deps = runtime.deps()
    with logs.context(run_id=str(request.get("run_id", ""))):
        return workspace_ops.serve(
            deps, request, workspace_steps.binary_client_for(deps.settings.redis_url)
        )


@app.task(name=TASK_REAP_HOST)
def reap_host() -> list[str]:
    deps = runtime.deps()
    report = lifecycle.reap_here(deps)
    lifecycle.warm_pools(deps)  # replace warm containers that expired unclaimed
    return report.lines() + [f"unreachable {u}" for u in report.unreachable]


@app.task(name=TASK_REAP)
def reap() -> int:
    """Beat's reaper (optional: every worker reaps on its own timer): fan out to every host
    that has a live worker, and close what waited too long for its host."""
    deps = runtime.deps()
    live = [q for q in deps.redis.hkeys(deps.keys.hosts()) if hosts.alive(deps.redis, deps.keys, q)]
    for queue in live:
        reap_host.apply_async(queue=queue)
    lifecycle.close_stranded_turns(deps)
    return len(live)


@setup_logging.connect
def _setup_logging(loglevel: int | str | None = None, **_: object) -> None:
    """Every record, Celery's included, as one structured line (worker/observe/logs.py)."""
    logs.configure(get_settings().log_format, loglevel or "INFO")


@celeryd_after_setup.connect
def _consume_host_queues(sender: str, instance: Any, **_: object) -> None:
    """Consume the queues of the places this worker's sandboxes live (the Docker daemon by
    its ID and mark, this machine for the local sandbox): a run's later turns are routed
    there. Also their names from before names were shortened: runs placed then still send
    their turns and ends there (and the heartbeat marks every consumed queue alive).

    A worker whose settings are not valid (``HARNESS_REDIS_URL=notaurl``) does not start: it
    would announce itself ready and fail every turn."""
    try:
        deps = runtime.deps()
    except InvalidSettings as exc:
        log.critical("worker.invalid_settings", extra={"error": str(exc)})
        raise SystemExit(f"harness worker: {exc}") from None
    deadline = time.monotonic() + DOCKER_START_WAIT_S
    while True:
        try:
            served = host_queues.host_queues(deps.settings)
            break
        except SandboxError as exc:
            if time.monotonic() >= deadline:
                # Without its daemon's queue this worker could place no run where its later
                # turns find it: it does not start (a process manager starts it again).
                log.critical("worker.no_host_queue", extra={"error": str(exc)})
                raise SystemExit(f"harness worker: {exc}") from None
            log.warning("worker.waiting_for_docker", extra={"error": str(exc)})
            time.sleep(2)
    deps.host_queues.update(served.by_backend)
    for queue in served.consumed():
        instance.app.amqp.queues.select_add(direct_queue(queue))
    log.info(
        "worker.fleet.host_queues", extra={"queues": served.by_backend, "legacy": served.legacy}
    )


@worker_ready.connect
def _announce(sender: Any = None, **_: object) -> None:
    """Heartbeat every consumed queue, serve metrics, start the reaper (which warms pools)."""
    deps = runtime.deps()
    metrics.serve(deps.settings.metrics_port, deps.settings.metrics_addr)
    consumed = list(sender.app.amqp.queues.consume_from) if sender is not None else []
    host_queues = sorted(set(deps.host_queues.values()))
    heartbeat = hosts.Heartbeat(
        deps.redis,
        deps.keys,
        deps.worker_id,
        queues=tuple(sorted(set(consumed) | set(host_queues))),
        host_queues=tuple(host_queues),
        ttl_s=deps.settings.host_timeout_s,
    )
    heartbeat.start()
    _heartbeats.append(heartbeat)
    _stop_turns_before_cold_shutdown()
    # Its first pass runs now: it reaps what crashed here before and warms the pools.
    _stops.append(lifecycle.start_reaper(deps))
    _stops.append(firing.start_timer(deps))  # schedules: each tick fired once, fleet-wide
    # What the worker's start made (Celery, the models, our modules: over 100,000 objects) is
    # never garbage, yet every full collection walked it, and a flood's allocations set one
    # off often: out of the collector's sight now (docs/performance.md, row 2).
    gc.freeze()


def _stop_turns_before_cold_shutdown() -> None:
    """Run ahead of Celery's own SIGQUIT handler.

    Celery's cold shutdown cancels active requests through the pool, which the threads pool
    cannot do (celery 5.7 raises NotImplementedError), and then exits without waiting. So we
    stop every in-flight turn first (each publishes its ``shutdown`` terminal and kills its
    harness) and only then hand over to Celery.
    """
    celery_handler = signal.getsignal(signal.SIGQUIT)

    def handler(signum: int, frame: object) -> None:
        shutdown = runtime.deps().shutdown
        shutdown.request(immediate=True)
        shutdown.wait_idle(timeout_s=15)
        if callable(celery_handler):
            celery_handler(signum, frame)  # type: ignore[arg-type]

    signal.signal(signal.SIGQUIT, handler)


@worker_shutting_down.connect
def _shutting_down(how: str = "Warm", **_: object) -> None:
    """Warm: in-flight turns get HARNESS_SHUTDOWN_GRACE_S, then end with reason ``shutdown``
    while Celery waits for them. Cold (SIGQUIT, a second SIGINT): Celery will not wait, so stop
    every turn now and hold the process until they have published their terminal events."""
    deps = runtime.deps()
    shutdown = deps.shutdown
    if how == "Cold":
        shutdown.request(immediate=True)
        shutdown.wait_idle(timeout_s=15)
    else:
        shutdown.request()
    lifecycle.drain_pools(deps)


@worker_shutdown.connect
def _gone(**_: object) -> None:
    """The worker has stopped consuming: stop beating, so producers learn it at once."""
    for stop in _stops:
        stop.set()
    try:
        for heartbeat in _heartbeats:
            heartbeat.stop()
    except REDIS_ERRORS as exc:
        log.warning("host.heartbeat_stop_failed", extra={"error": str(exc)})
    tracing.shutdown()  # the spans of the last turns, exported before the process exits


@worker_process_shutdown.connect
def _child_gone(**_: object) -> None:
    """A prefork child exits: its batched spans go first."""
    tracing.shutdown()
