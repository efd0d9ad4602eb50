"""Celery tasks: decode the payload, call a function that knows nothing of Celery."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import redis
from celery import Task
from celery.signals import setup_logging, worker_ready, worker_shutting_down

from config import get_settings
from worker import hosts, lifecycle, logs, metrics, runtime
from worker.app import app
from worker.app_names import TASK_END_RUN, TASK_REAP, TASK_REAP_HOST
from worker.publisher import last_seq
from worker.spec import TurnPayload
from worker.turn import close_lost_turn, execute_turn

log = logging.getLogger(__name__)


@app.task(name="harness.run_turn", bind=True, acks_late=True, max_retries=30)
def run_turn(self: Task, payload: dict[str, Any]) -> str:
    turn = TurnPayload.model_validate(payload)
    deps = runtime.deps()
    try:
        with logs.context(run_id=turn.run_id, turn=turn.turn):
            return execute_turn(deps, turn)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # Redis unreachable before the turn could be taken: try again shortly.
        raise self.retry(exc=exc, countdown=2) from exc
    except Exception as exc:
        log.exception("turn.internal_error", extra={"run_id": turn.run_id, "turn": turn.turn})
        _, last_type = last_seq(deps.redis, deps.keys, turn.run_id, turn.turn)
        if last_type not in ("turn-complete", "session-error"):
            close_lost_turn(deps, turn.run_id, turn.turn, "", error=f"internal error: {exc}")
        return "internal-error"


@app.task(name=TASK_END_RUN, acks_late=True)
def end_run(run_id: str) -> bool:
    return lifecycle.end_run(runtime.deps(), run_id)


@app.task(name=TASK_REAP_HOST)
def reap_host() -> list[str]:
    removed = lifecycle.reap_here()
    lifecycle.warm_pools(runtime.deps())  # replace warm containers that expired unclaimed
    return removed


@app.task(name=TASK_REAP)
def reap() -> int:
    """Fan the reaper out to every host that has a live worker."""
    deps = runtime.deps()
    live = [q for q in deps.redis.hkeys(deps.keys.hosts()) if hosts.alive(deps.redis, deps.keys, q)]
    for queue in live:
        reap_host.apply_async(queue=queue)
    # Turns routed to a host that is gone would wait forever: close them here.
    lifecycle.close_stranded_turns(deps)
    return len(live)


@setup_logging.connect
def _setup_logging(loglevel: int | str | None = None, **_: object) -> None:
    """Every record, Celery's included, as one structured line (worker/logs.py)."""
    logs.configure(get_settings().log_format, loglevel or "INFO")


@worker_ready.connect
def _announce(**_: object) -> None:
    """Register this host's queue, serve metrics, clean up after what crashed here before."""
    deps = runtime.deps()
    metrics.serve(deps.settings.metrics_port, deps.settings.metrics_addr)
    hosts.start_heartbeat(
        deps.redis,
        deps.keys,
        deps.settings.host_queue,
        deps.worker_id,
        ttl_s=deps.settings.host_timeout_s,
    )
    deps.redis.hset(deps.keys.hosts(), deps.settings.host_queue, deps.worker_id)
    _stop_turns_before_cold_shutdown()
    try:
        for line in lifecycle.reap_here():
            log.info("reaper.startup", extra={"removed": line})
    except Exception:
        log.exception("reaper.startup_failed")
    threading.Thread(
        target=lifecycle.warm_pools, args=(deps,), name="warm-pool", daemon=True
    ).start()


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
