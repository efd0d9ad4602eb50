"""Ending runs and reaping what crashes leave behind. Knows nothing of Celery."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.events import TERMINAL_TYPES, session_error
from config import Settings
from sandbox.base import LABEL_WORKER, Egress, Limits, RunSpec, Sandbox, SandboxError, WarmPool
from worker.control import delivery
from worker.errors import RunNotFound
from worker.fleet import hosts
from worker.observe import metrics
from worker.spend import parking, slots
from worker.store import credentials, queued
from worker.store.errors import REDIS_ERRORS
from worker.store.publisher import last_seq
from worker.store.queued import SendTurn
from worker.store.records import RunRecord
from worker.store.status import EXECUTING, FINISHED
from worker.store.terminal import TurnRef, end_unclaimed_turn
from worker.turn.execute import TurnDeps, close_lost_turn

log = logging.getLogger(__name__)


def end_run(deps: TurnDeps, run_id: str) -> bool:
    """Tear a run down on this host: process, sandbox, workspace (per scope). Idempotent."""
    try:
        record = deps.store.record(run_id)
    except RunNotFound:
        return False
    backend = record.sandbox or deps.settings.sandbox
    _wait_for_turn_to_stop(deps, run_id, record)
    try:
        sandbox = deps.sandbox_for(backend)
        sandbox.teardown(run_id, keep_workspace=_keeps_workspace(record))
    except SandboxError as exc:
        metrics.teardown_failed()
        log.warning("run.teardown_failed", extra={"run_id": run_id, "error": str(exc)})
    credentials.revoke(deps.redis, deps.keys, run_id)
    deps.store.end_run(run_id, maxlen=deps.settings.stream_maxlen)
    deps.store.expire(run_id, deps.settings.retention_s)
    deps.redis.srem(deps.keys.runs_index(), run_id)
    log.info("run.ended", extra={"run_id": run_id})
    return True


def _keeps_workspace(record: RunRecord | None) -> bool:
    return bool(record and record.options and record.options.workspace)


def _wait_for_turn_to_stop(deps: TurnDeps, run_id: str, record: RunRecord) -> None:
    """The client cancelled the in-flight turn before asking for the end: let it publish its
    ``cancelled`` terminal before the sandbox goes, rather than fail as a sandbox error."""
    turn = record.current_turn or 0
    if record.status not in EXECUTING or not turn:
        return
    deadline = time.monotonic() + deps.settings.kill_grace_s + 10
    while time.monotonic() < deadline and deps.redis.exists(deps.keys.turn_owner(run_id, turn)):
        time.sleep(0.1)


@dataclass
class ReapReport:
    sandboxes: list[str] = field(default_factory=list)
    lost_turns: list[str] = field(default_factory=list)
    waited_out: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    """Sandbox backends that could not be asked for their sandboxes, with the error."""
    slots_released: list[str] = field(default_factory=list)
    """Concurrency slots of keys released because the turn holding them lost its worker."""
    gateways: list[str] = field(default_factory=list)
    """What was done to egress gateways (an unhealthy one replaced)."""
    delivered: list[str] = field(default_factory=list)
    """Turns started with messages that waited in an inbox (their turn's worker died)."""

    def lines(self) -> list[str]:
        out = [f"removed sandbox of run {r}" for r in self.sandboxes]
        out += [f"closed turn {t} (worker lost)" for t in self.lost_turns]
        out += [f"closed turn {t} (its host had no worker for too long)" for t in self.waited_out]
        out += [f"sent turn {t} again (no worker had taken it)" for t in self.resent]
        out += [f"released key slot {s} (its worker was lost)" for s in self.slots_released]
        out += [f"started turn {t} with the messages waiting for it" for t in self.delivered]
        out += self.gateways
        return out


def reap_sandboxes(deps: TurnDeps, sandbox: Sandbox, report: ReapReport) -> None:
    """Remove this host's sandboxes whose run ended, is unknown, or whose lease expired."""
    now = time.time()
    for found in sandbox.managed():
        record = deps.store.find(found.run_id)
        status = record.status if record else None
        lease = found.lease_until
        if record and record.lease_until:
            lease = max(lease or 0.0, record.lease_until)
        expired = lease is not None and lease < now
        if found.run_id.startswith("pool-"):
            if expired:  # a warm container nobody claimed in time
                sandbox.teardown(found.run_id)
                report.sandboxes.append(found.run_id)
            continue
        if status is None or status in FINISHED or (expired and status not in EXECUTING):
            sandbox.teardown(found.run_id, keep_workspace=_keeps_workspace(record))
            credentials.revoke(deps.redis, deps.keys, found.run_id)
            report.sandboxes.append(found.run_id)
            metrics.reaped(sandbox.backend)
            if record and status not in FINISHED:
                deps.store.end_run(
                    found.run_id, maxlen=deps.settings.stream_maxlen, last_error="lease expired"
                )
            log.info("reaper.removed", extra={"run_id": found.run_id, "status": status})
    if isinstance(sandbox, Egress):
        done = sandbox.reap_gateway()
        if done:
            report.gateways.append(done)


def close_lost_turns(deps: TurnDeps, report: ReapReport) -> None:
    """Give every in-flight turn whose worker stopped heartbeating its ``worker-lost`` end."""

    def step(run_id: str) -> None:
        record = deps.store.find(run_id)
        if record is None:
            deps.redis.srem(deps.keys.runs_index(), run_id)
            report.forgotten.append(run_id)
            return
        turn = record.current_turn or 0
        if record.status not in EXECUTING or turn < 1:
            return
        if not deps.redis.exists(deps.keys.turn_started(run_id, turn)):
            return  # still queued: not lost
        if deps.redis.exists(deps.keys.turn_owner(run_id, turn)):
            return  # its worker is alive
        _, last_type = last_seq(deps.redis, deps.keys, run_id, turn)
        if last_type in TERMINAL_TYPES:
            return
        close_lost_turn(deps, run_id, turn, record.harness)
        report.lost_turns.append(f"{run_id}/{turn}")

    _each_run(deps, "close_lost_turns", step)


def _each_run(deps: TurnDeps, what: str, step: Callable[[str], None]) -> None:
    """``step`` for every run that may hold a sandbox. One run's problem (a record no longer
    readable, a bug) is logged and the pass goes on: it must not stop the reaper for every
    other run. Redis unreachable stops the pass; the next tick tries again."""
    for run_id in deps.redis.smembers(deps.keys.runs_index()):
        try:
            step(run_id)
        except REDIS_ERRORS:
            raise
        except Exception:
            log.exception("reaper.run_failed", extra={"run_id": run_id, "step": what})


def reap_here(deps: TurnDeps) -> ReapReport:
    """One full reaper pass from here, without the fleet's locks (an operator's ``harness
    reap``, beat's fan-out): every run's in-flight turns, then this host's sandboxes."""
    report = ReapReport()
    _reap_turns(deps, report)
    for backend in ("docker", "local"):
        try:
            reap_sandboxes(deps, deps.sandbox_for(backend), report)
        except SandboxError as exc:
            if backend == deps.settings.sandbox or backend in deps.host_queues:
                report.unreachable.append(f"{backend}: {exc}")
            log.warning("reaper.backend_unavailable", extra={"backend": backend, "error": str(exc)})
    return report


def _reap_turns(deps: TurnDeps, report: ReapReport) -> None:
    # A lost turn is closed first; the run stays usable, so its sandbox is kept.
    close_lost_turns(deps, report)
    close_stranded_turns(deps, report)
    report.resent += resend_queued_turns(deps, deps.send_turn)
    # Concurrency slots held by turns whose worker is gone (worker/spend/slots.py).
    report.slots_released += slots.reap(deps)
    deliver_waiting_messages(deps, report)


def deliver_waiting_messages(deps: TurnDeps, report: ReapReport) -> None:
    """The backstop of message delivery: a run whose inbox holds messages and no turn in
    flight (the worker that ended its last turn died before it delivered) gets its next turn.
    """
    post = delivery.post_for(deps)
    for run_id in sorted(deps.redis.smembers(deps.keys.inboxes())):
        try:
            turn = delivery.deliver(post, run_id)
        except Exception as exc:  # noqa: BLE001 -- one run's trouble is not the pass's
            log.warning("reaper.delivery_failed", extra={"run_id": run_id, "error": str(exc)})
            continue
        if turn is not None:
            report.delivered.append(f"{run_id}/{turn}")


def reap_pass(deps: TurnDeps) -> ReapReport:
    """The pass every worker runs on its timer. The fleet-wide part (turns) runs in one worker
    per interval, the sandbox part in one worker per host per interval: a lock in Redis that
    lives one interval decides which, so passes never overlap and no beat process is needed.
    """
    report = ReapReport()
    interval = deps.settings.reap_interval_s
    if _take_lock(deps, "fleet", interval):
        _reap_turns(deps, report)
    for backend, queue in sorted(deps.host_queues.items()):
        if not _take_lock(deps, f"{queue}:{backend}", interval):
            continue
        try:
            reap_sandboxes(deps, deps.sandbox_for(backend), report)
        except SandboxError as exc:
            report.unreachable.append(f"{backend}: {exc}")
            log.warning("reaper.backend_unavailable", extra={"backend": backend, "error": str(exc)})
        if backend == "docker":
            warm_pools(deps)  # replace warm containers that expired unclaimed
    for line in report.lines():
        log.info("reaper.pass", extra={"done": line})
    return report


def _take_lock(deps: TurnDeps, scope: str, interval_s: float) -> bool:
    """The lock is never released: it lapses, so a scope is passed over once per interval."""
    ttl_ms = max(int(interval_s * 1000 * 0.9), 200)
    return bool(deps.redis.set(deps.keys.reaper_lock(scope), deps.worker_id, nx=True, px=ttl_ms))


def start_reaper(deps: TurnDeps) -> threading.Event:
    """Run :func:`reap_pass` now and then every few seconds (each pass takes its locks, so
    the fleet reaps about once per HARNESS_REAP_INTERVAL_S whatever its size)."""
    stop = threading.Event()
    tick = min(max(deps.settings.reap_interval_s / 4, 0.5), 15.0)

    def loop() -> None:
        first = True
        while True:
            try:
                reap_pass(deps)
                if first:
                    # A worker warms its pool as it starts, though the host's lock may be
                    # another worker's (one that just stopped holds it for an interval).
                    warm_pools(deps)
                    first = False
            except Exception as exc:  # noqa: BLE001 -- Redis or Docker away: next tick
                log.warning("reaper.pass_failed", extra={"error": str(exc)})
            if stop.wait(tick):
                return

    threading.Thread(target=loop, name="reaper", daemon=True).start()
    return stop


def fail_stranded_turn(deps: TurnDeps, run_id: str, turn: int, harness: str, queue: str) -> bool:
    """End a turn that waited HARNESS_HOST_WAIT_S for a worker on its run's host. The run
    stays usable and keeps its sandbox. False if a worker took the turn meanwhile."""
    settings, keys = deps.settings, deps.keys
    error = (
        f"no worker consumed {queue}, the host of this run's sandbox, for "
        f"{settings.host_wait_s:g}s (HARNESS_HOST_WAIT_S); the run and its workspace are "
        "kept there: submit the turn again once a worker runs on that host, or end the run"
    )
    ref = TurnRef(deps.redis, keys, deps.store, settings, run_id, turn, harness)
    if not end_unclaimed_turn(ref, session_error(error, "sandbox"), caller="unclaimed"):
        return False
    deps.redis.delete(keys.turn_queued(run_id, turn))
    credentials.revoke(deps.redis, keys, run_id, through=turn)  # never a later turn's
    metrics.turn_failed(harness, "sandbox")
    log.warning("turn.host_away", extra={"run_id": run_id, "turn": turn, "queue": queue})
    return True


def close_stranded_turns(deps: TurnDeps, report: ReapReport | None = None) -> None:
    """Close queued turns that waited too long for a worker on their run's host."""
    now = time.time()

    def step(run_id: str) -> None:
        record = deps.store.find(run_id)
        if record is None or record.status not in EXECUTING:
            return
        queue = record.queue or ""
        if not hosts.is_host_queue(queue, deps.keys) or hosts.alive(deps.redis, deps.keys, queue):
            return
        turn = record.current_turn or 0
        if not turn or deps.redis.exists(deps.keys.turn_started(run_id, turn)):
            return
        # A producer that sent the turn set the run running then: the record's last update is
        # when, should the queued entry be gone.
        sent_at = deps.store.queued_since(run_id, turn) or record.updated_at or now
        if now - sent_at < deps.settings.host_wait_s:
            return
        if fail_stranded_turn(deps, run_id, turn, record.harness, queue) and report is not None:
            report.waited_out.append(f"{run_id}/{turn}")

    _each_run(deps, "close_stranded_turns", step)


def warm_pools(deps: TurnDeps) -> int:
    """Keep HARNESS_WARM_POOL started containers per configured image on this host, shaped as
    a run with the default network and limits gets them (other runs create their own)."""
    settings = deps.settings
    if settings.warm_pool <= 0 or not _docker_in_use(settings):
        return 0

    sandbox = deps.sandbox_for("docker")
    if not isinstance(sandbox, WarmPool):
        return 0
    started = 0
    for image in sorted(set(settings.images.values())):
        try:
            if not sandbox.image_exists(image):
                continue
            started += sandbox.warm(
                RunSpec(
                    run_id="pool-template",
                    image=image,
                    network=settings.network,
                    limits=Limits(settings.memory, settings.cpus, settings.pids),
                    user=settings.container_user,
                    read_only_root=settings.read_only_root,
                    labels={LABEL_WORKER: deps.worker_id},
                )
            )
        except SandboxError as exc:
            log.warning("sandbox.pool_failed", extra={"image": image, "error": str(exc)})
    return started


def drain_pools(deps: TurnDeps) -> None:
    """Remove this deployment's unclaimed warm containers on this host (a worker going away
    must not leave idle containers behind; the next worker to start warms the pool again)."""
    if deps.settings.warm_pool <= 0 or not _docker_in_use(deps.settings):
        return
    try:
        sandbox = deps.sandbox_for("docker")
        if isinstance(sandbox, WarmPool):
            sandbox.close_pool()
    except SandboxError as exc:
        log.warning("sandbox.pool_drain_failed", extra={"error": str(exc)})


def _docker_in_use(settings: Settings) -> bool:
    allowed = settings.allowed_sandboxes
    return settings.sandbox == "docker" or "docker" in allowed or "*" in allowed


def resend_queued_turns(deps: TurnDeps, send: SendTurn) -> list[str]:
    """Send again every queued turn no worker has taken in time: a turn in flight sent
    HARNESS_RESEND_AFTER_S ago, and a parked turn whose countdown was lost with its worker
    (never before its reset: :func:`worker.spend.parking.resend_not_before`). Each goes
    through :func:`resend_queued_turn`, the one re-sender."""
    resent: list[str] = []

    def step(run_id: str) -> None:
        record = deps.store.find(run_id)
        if record is None or not record.current_turn:
            return
        if record.status in EXECUTING:
            not_before = 0.0
        elif record.status == "parked":
            not_before = parking.resend_not_before(record, deps.settings)
        else:
            return
        if resend_queued_turn(deps, run_id, record.current_turn, send, not_before=not_before):
            resent.append(f"{run_id}/{record.current_turn}")

    _each_run(deps, "resend_queued_turns", step)
    return resent


def resend_queued_turn(
    deps: TurnDeps, run_id: str, turn: int, send: SendTurn, *, not_before: float = 0.0
) -> bool:
    """Send queued turn ``turn`` again; True when sent. Sent only while the turn is queued
    (its entry is there: a claim takes it, a cancel or an end removes it) and no worker has
    claimed it, once nothing sent it for HARNESS_RESEND_AFTER_S and not before
    ``not_before``, and not to a host queue no live worker consumes (close_stranded_turns
    ends such a turn instead).

    A turn's payload stays in Redis until a worker takes it. Should the broker lose the
    message (kombu's Redis transport can, when a worker dies holding it), the turn would wait
    forever; sending it again is safe because only the first copy to reach a worker claims
    the turn (claim_turn.lua), and every later copy is dropped as a duplicate.
    """
    now = time.time()
    if now < not_before or deps.redis.exists(deps.keys.turn_started(run_id, turn)):
        return False
    entry = queued.read(deps.redis, deps.keys, run_id, turn)
    if entry is None or now - entry.sent_at < deps.settings.resend_after_s:
        return False
    queue = entry.queue
    if hosts.is_host_queue(queue, deps.keys) and not hosts.alive(deps.redis, deps.keys, queue):
        return False
    entry.sent_again(now).write(deps.redis, deps.keys, run_id, turn, deps.settings.retention_s)
    send(entry.payload, queue, 0.0)
    log.warning("turn.resent", extra={"run_id": run_id, "turn": turn, "queue": queue})
    return True
