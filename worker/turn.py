"""One turn of a run, from a decoded payload to its terminal event. Knows nothing of Celery.

Every path ends the turn with exactly one terminal event, published after the run record
is updated: success, harness failure, invalid input, sandbox failure, cancel, timeout,
worker shutdown. A redelivered turn never runs the harness twice: the first worker to take
a turn marks it started; a later delivery finds the mark and either sees the turn finished,
sees its owner alive, or (owner dead) closes it with ``worker-lost``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

import adapters
from adapters.events import (
    Event,
    SessionError,
    TurnComplete,
    TurnStarted,
    Usage,
    session_error,
)
from adapters.protocol import TurnRequest
from adapters.stream import StreamDriver
from config import Settings
from sandbox.base import ExecSpec, Limits, Placement, RunSpec, Sandbox, SandboxError
from worker import attempt, credentials, logs, metrics
from worker.app_names import harness_queue
from worker.credentials import CREDENTIAL_ENV
from worker.errors import InvalidInput, RunNotFound
from worker.keys import Keys, SyncRedis
from worker.policy import check_input, resolve, resolve_secrets
from worker.publisher import Masker, RedisStreamPublisher, last_seq
from worker.records import RunStore
from worker.spec import RunOptions, TurnPayload

log = logging.getLogger(__name__)

# Take a turn: the started mark and the owner's heartbeat are set together or not at all, so
# a Redis error between the two cannot make a turn that never ran look like a lost one.
_CLAIM_TURN = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
  return 1
end
return 0
"""

REDIS_PATIENCE_S = 600.0
"""How long a finished turn keeps trying to reach Redis before giving up its events."""


@dataclass
class Shutdown:
    """Set when the worker begins a warm shutdown; turns get ``grace_s`` to finish."""

    grace_s: float
    requested_at: float | None = None
    event: threading.Event = dataclasses.field(default_factory=threading.Event)
    active: int = 0
    _lock: threading.Condition = dataclasses.field(default_factory=threading.Condition)

    def request(self, *, immediate: bool = False) -> None:
        if immediate:
            self.grace_s = 0.0
        if self.requested_at is None:
            self.requested_at = time.monotonic()
        self.event.set()

    def enter(self) -> None:
        with self._lock:
            self.active += 1

    def leave(self) -> None:
        with self._lock:
            self.active -= 1
            self._lock.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no turn is in flight (used by a cold shutdown before the process exits)."""
        with self._lock:
            return self._lock.wait_for(lambda: self.active == 0, timeout_s)

    def expired(self) -> bool:
        return self.requested_at is not None and (
            time.monotonic() - self.requested_at >= self.grace_s
        )


@dataclass
class TurnDeps:
    settings: Settings
    redis: SyncRedis
    keys: Keys
    store: RunStore
    sandbox_for: Callable[[str], Sandbox]
    worker_id: str
    shutdown: Shutdown


def execute_turn(deps: TurnDeps, payload: TurnPayload) -> str:
    """Run one turn to its terminal event. Returns a short outcome label for logs and Flower."""
    run_id, turn = payload.run_id, payload.turn
    keys = deps.keys
    try:
        options = deps.store.options(run_id)
    except RunNotFound:
        log.warning("turn.unknown_run", extra={"run_id": run_id, "turn": turn})
        return "unknown-run"

    started_ttl = deps.settings.retention_s + deps.settings.run_lease_s
    owner_key = keys.turn_owner(run_id, turn)
    claimed = deps.redis.eval(
        _CLAIM_TURN,
        2,
        keys.turn_started(run_id, turn),
        owner_key,
        deps.worker_id,
        started_ttl,
        deps.settings.heartbeat_ttl_s,
    )
    if not claimed:
        return _redelivered(deps, run_id, turn, options)
    deps.redis.delete(keys.turn_queued(run_id, turn))

    logs.bind(harness=options.harness)
    log.info("turn.started", extra={"run_id": run_id, "turn": turn, "harness": options.harness})
    started, outcome = metrics.turn_started(options.harness), "internal-error"
    deps.shutdown.enter()
    try:
        outcome = _run(deps, payload, options)
        return outcome
    finally:
        deps.shutdown.leave()
        metrics.turn_finished(options.harness, outcome, started)
        _retry_redis(lambda: deps.redis.delete(owner_key))


def _run(deps: TurnDeps, payload: TurnPayload, options: RunOptions) -> str:
    run_id, turn, settings = payload.run_id, payload.turn, deps.settings
    adapter = adapters.get(options.harness)
    publisher = RedisStreamPublisher(
        deps.redis, deps.keys, run_id, turn, maxlen=settings.stream_maxlen
    )
    out = attempt.Publishing(publisher)
    header = TurnStarted(harness=options.harness, attempt=1, input_chars=len(payload.input))

    def refuse(error: SessionError, *, run_status: str = "idle") -> str:
        out.send([header])
        return _close(deps, payload, options, out, error, run_status=run_status, final_text=None)

    if deps.redis.exists(deps.keys.cancel(run_id, turn)):
        return refuse(session_error("the turn was cancelled before it started", "cancelled"))
    try:
        resolved = resolve(options, settings)
        check_input(payload.input, settings)
        secrets = resolve_secrets(options, settings)
    except InvalidInput as exc:
        return refuse(
            session_error(str(exc), "invalid-input"), run_status=_status_after_refusal(turn)
        )
    credential_ttl = int(settings.run_lease_s + settings.max_turn_timeout_s)
    secrets[CREDENTIAL_ENV] = credentials.issue(deps.redis, deps.keys, run_id, credential_ttl)
    logs.mask(secrets)
    out.publisher = RedisStreamPublisher(
        deps.redis, deps.keys, run_id, turn, maxlen=settings.stream_maxlen, masker=Masker(secrets)
    )

    record = deps.store.get(run_id)
    sandbox = deps.sandbox_for(resolved.sandbox)
    lease_until = time.time() + settings.run_lease_s
    try:
        placement = sandbox.prepare(
            RunSpec(
                run_id=run_id,
                image=resolved.image,
                network=resolved.network,  # type: ignore[arg-type]
                limits=Limits(resolved.memory, resolved.cpus, resolved.pids),
                user=settings.container_user,
                read_only_root=settings.read_only_root,
                workspace_key=options.workspace,
                labels={
                    "harness.worker": deps.worker_id,
                    "harness.lease_until": f"{lease_until:.0f}",
                },
            )
        )
        sandbox.renew(run_id, lease_until)
    except SandboxError as exc:
        if turn == 1:
            sandbox.teardown(run_id, keep_workspace=options.workspace is not None)
            credentials.revoke(deps.redis, deps.keys, run_id)
        return refuse(
            session_error(f"the sandbox could not be prepared: {exc}", "sandbox"),
            run_status="failed" if turn == 1 else "idle",
        )
    deps.store.mark_running(run_id)
    deps.store.update(
        run_id,
        container_id=placement.container_id,
        queue=settings.host_queue,
        lease_until=lease_until,
        sandbox=placement.backend,
    )
    log.info(
        "sandbox.ready",
        extra={"backend": placement.backend, "container": placement.container_id},
    )

    request = _request(options, payload, placement, record, resolved.executable, secrets)
    warning = adapter.policy_warning(request)
    if warning and turn == 1:
        deps.store.update(run_id, warnings=[warning])
        log.warning("turn.policy_not_enforced", extra={"run_id": run_id, "warning": warning})

    deadline = time.monotonic() + resolved.timeout_s
    limits = attempt.Limits(
        deadline,
        settings.idle_timeout_s,
        settings.exit_grace_s,
        settings.kill_grace_s,
        settings.max_line_bytes,
    )
    stop = _stop_check(deps, run_id, turn)

    outcome, driver = _attempt(adapter, request, sandbox, placement, secrets, out, limits, stop, 1)
    terminal = _explain_kill(outcome.terminal, sandbox, run_id)
    if (
        isinstance(terminal, SessionError)
        and request.resume_session
        and getattr(driver.state, "resume_rejected", False)
    ):
        log.info("turn.resume_rejected", extra={"run_id": run_id, "turn": turn})
        replayed = _replay_text(deps.store.transcript(run_id))
        fresh = dataclasses.replace(
            request,
            resume_session=None,
            input=f"{replayed}{payload.input}" if replayed else payload.input,
        )
        if replayed:
            out.send([Usage(input_tokens=math.ceil(len(replayed) / 4), source="replay")])
        outcome, driver = _attempt(
            adapter, fresh, sandbox, placement, secrets, out, limits, stop, 2
        )
        terminal = outcome.terminal

    if isinstance(terminal, SessionError) and terminal.reason == "shutdown":
        _release_for_shutdown(deps, run_id, options, sandbox)

    carry = getattr(driver.state, "carry", None)
    final_text = terminal.text if isinstance(terminal, TurnComplete) else None
    extra: dict[str, Any] = {"carry": carry} if carry else {}
    return _close(
        deps, payload, options, out, terminal, run_status="idle", final_text=final_text, extra=extra
    )


def _explain_kill(terminal: Event, sandbox: Sandbox, run_id: str) -> Event:
    """A harness that died of SIGKILL we did not send: ask the sandbox why (OOM, gone)."""
    if (
        isinstance(terminal, SessionError)
        and terminal.reason == "exit"
        and terminal.exit_code in (137, -9)
    ):
        problem = sandbox.diagnose(run_id)
        if problem:
            return terminal.model_copy(
                update={
                    "error": f"the harness was killed: {problem}",
                    "reason": "sandbox",
                    "retryable": True,
                }
            )
    return terminal


def _release_for_shutdown(
    deps: TurnDeps, run_id: str, options: RunOptions, sandbox: Sandbox
) -> None:
    """This worker is going away: free the run's sandbox so any worker can take its next turn."""
    if not deps.settings.teardown_on_shutdown:
        return
    sandbox.teardown(run_id, keep_workspace=True)
    credentials.revoke(deps.redis, deps.keys, run_id)
    queue = harness_queue(options.harness, deps.settings.key_prefix)
    _retry_redis(lambda: deps.store.update(run_id, queue=queue, container_id=None))


def _attempt(
    adapter: Any,
    request: TurnRequest,
    sandbox: Sandbox,
    placement: Placement,
    secrets: dict[str, str],
    out: attempt.Publishing,
    limits: attempt.Limits,
    stop: Callable[[], SessionError | None],
    number: int,
) -> tuple[attempt.Outcome, StreamDriver]:
    driver = StreamDriver(adapter, request, attempt=number, max_line_bytes=limits.max_line_bytes)
    head = driver.start()
    if number == 1:
        out.send(head)
    try:
        command = adapter.build_command(request)
    except ValueError as exc:
        driver.fail(session_error(f"cannot build the command: {exc}", "invalid-input"))
        assert driver.terminal is not None
        return attempt.Outcome(driver.terminal, None, ""), driver
    spec = ExecSpec(
        argv=tuple(command.argv),
        stdin=command.stdin,
        env=dict(command.env),
        files=dict(command.files),
        cwd=command.cwd,
    )
    try:
        process = sandbox.start(placement, spec, secrets)
    except SandboxError as exc:
        driver.fail(session_error(f"the harness could not be started: {exc}", "sandbox"))
        assert driver.terminal is not None
        return attempt.Outcome(driver.terminal, None, ""), driver
    log.info("harness.started", extra={"attempt": number, "executable": spec.argv[0]})
    try:
        outcome = attempt.drive(process, driver, out, limits, stop)
        log.info("harness.exited", extra={"attempt": number, "exit_code": outcome.exit_code})
    except SandboxError as exc:
        with contextlib.suppress(SandboxError):
            process.kill(grace=limits.kill_grace_s)
        problem = sandbox.diagnose(placement.run_id) or str(exc)
        driver.fail(session_error(f"the sandbox failed during the turn: {problem}", "sandbox"))
        assert driver.terminal is not None
        outcome = attempt.Outcome(driver.terminal, None, "")
    return outcome, driver


def _request(
    options: RunOptions,
    payload: TurnPayload,
    placement: Placement,
    record: dict[str, Any],
    executable: str | None,
    secrets: dict[str, str],
) -> TurnRequest:
    resume = options.resume_session if payload.turn == 1 else record.get("session_id") or None
    return TurnRequest(
        input=payload.input,
        turn=payload.turn,
        workspace=placement.workspace,
        home=placement.home,
        model=options.model,
        system_prompt=options.system_prompt,
        posture=options.posture,
        allow=options.allow,
        deny=options.deny,
        resume_session=resume,
        base_url=options.base_url,
        executable=executable,
        granted_env=frozenset(secrets),
        carry=record.get("carry") or {},
    )


def _stop_check(deps: TurnDeps, run_id: str, turn: int) -> Callable[[], SessionError | None]:
    cancel_key = deps.keys.cancel(run_id, turn)
    owner_key = deps.keys.turn_owner(run_id, turn)
    last_beat = [time.monotonic()]

    def check() -> SessionError | None:
        if deps.shutdown.expired():
            return session_error("the worker is shutting down", "shutdown")
        try:
            if deps.redis.exists(cancel_key):
                return session_error("the turn was cancelled", "cancelled")
            now = time.monotonic()
            if now - last_beat[0] >= deps.settings.heartbeat_ttl_s / 3:
                deps.redis.set(owner_key, deps.worker_id, ex=deps.settings.heartbeat_ttl_s)
                last_beat[0] = now
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # Redis is away: the turn goes on, its events wait in the publisher
        return None

    return check


def _replay_text(transcript: list[dict[str, Any]]) -> str:
    if not transcript:
        return ""
    parts = ["[The previous session could not be resumed. The conversation so far:]"]
    for entry in transcript:
        parts.append(f"[user]\n{entry.get('input', '')}")
        if entry.get("output"):
            parts.append(f"[assistant]\n{entry['output']}")
    parts.append("[user]\n")
    return "\n\n".join(parts)


def _status_after_refusal(turn: int) -> str:
    return "failed" if turn == 1 else "idle"


def _close(
    deps: TurnDeps,
    payload: TurnPayload,
    options: RunOptions,
    out: attempt.Publishing,
    terminal: Event,
    *,
    run_status: str,
    final_text: str | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Record the turn, then publish its terminal event. Survives a Redis outage."""
    run_id, turn = payload.run_id, payload.turn
    fields: dict[str, Any] = dict(extra or {})
    for session in out.sessions:
        fields["session_id"] = session.session_id
        fields["resumed"] = session.resumed
        if session.model:
            fields["model_reported"] = session.model
    if isinstance(terminal, TurnComplete):
        if terminal.session_id:
            fields["session_id"] = terminal.session_id
        if terminal.model:
            fields["model_reported"] = terminal.model
        fields["last_error"] = ""
    elif isinstance(terminal, SessionError):
        fields["last_error"] = f"{terminal.reason}: {terminal.error}"
    # Everything the harness said may carry a granted value it printed: mask what Redis keeps.
    mask = out.publisher.masker.mask
    fields = {k: mask(v) if isinstance(v, str) else v for k, v in fields.items()}
    _retry_redis(
        lambda: deps.store.finish_turn(
            run_id, turn, status=run_status, usage=out.usage.as_tuple(), fields=fields
        )
    )
    if final_text is not None:
        # The transcript is replayed into a fresh session later: keep granted values out of it.
        said, answered = mask(payload.input), mask(final_text)
        _retry_redis(lambda: deps.store.append_transcript(run_id, turn, said, answered))
    out.send([terminal])
    if not out.publisher.drain(REDIS_PATIENCE_S):
        log.error(
            "stream.lost", extra={"run_id": run_id, "turn": turn, "pending": out.publisher.pending}
        )
    if run_status == "failed":
        _retry_redis(lambda: deps.store.expire(run_id, deps.settings.retention_s))
    else:
        _retry_redis(
            lambda: deps.store.expire(run_id, deps.settings.retention_s + deps.settings.run_lease_s)
        )
    label = (
        "completed"
        if isinstance(terminal, TurnComplete)
        else f"failed:{getattr(terminal, 'reason', '')}"
    )
    log.info("turn.finished", extra={"run_id": run_id, "turn": turn, "outcome": label})
    return label


def _redelivered(deps: TurnDeps, run_id: str, turn: int, options: RunOptions) -> str:
    """A turn some worker already took: finished, in flight, or orphaned by a dead worker."""
    _, last_type = last_seq(deps.redis, deps.keys, run_id, turn)
    if last_type in ("turn-complete", "session-error"):
        log.info("turn.duplicate_ignored", extra={"run_id": run_id, "turn": turn})
        return "duplicate"
    if deps.redis.exists(deps.keys.turn_owner(run_id, turn)):
        log.info("turn.duplicate_in_flight", extra={"run_id": run_id, "turn": turn})
        return "duplicate"
    return close_lost_turn(deps, run_id, turn, options.harness)


def end_turn_without_harness(
    client: SyncRedis,
    keys: Keys,
    store: RunStore,
    stream_maxlen: int,
    run_id: str,
    turn: int,
    harness: str,
    error: SessionError,
    *,
    run_status: str,
    drain_s: float,
) -> None:
    """The one terminal event of a turn no harness will finish (its worker died, its host is
    gone, it was cancelled in the queue): ``turn-started`` first when the turn has no event
    yet, then the error. The run record is updated first, as ``_close`` does."""
    next_seq, _ = last_seq(client, keys, run_id, turn)
    publisher = RedisStreamPublisher(
        client, keys, run_id, turn, maxlen=stream_maxlen, start_seq=next_seq
    )
    events: list[Event] = []
    if next_seq == 0:
        events.append(TurnStarted(harness=harness, attempt=1, input_chars=0))
    events.append(error)
    fields = {"last_error": f"{error.reason}: {error.error}"}
    store.finish_turn(run_id, turn, status=run_status, usage=(0, 0, 0, None), fields=fields)
    publisher.publish(events)
    publisher.drain(drain_s)


def close_lost_turn(
    deps: TurnDeps,
    run_id: str,
    turn: int,
    harness: str,
    error: str = "the worker running this turn was lost",
) -> str:
    """Give a turn whose worker died its one terminal event (reason ``worker-lost``)."""
    # The run's sandbox may hold a half-done turn: the run ends here. The reaper on its host
    # removes the sandbox (status failed), and the credential is revoked now.
    credentials.revoke(deps.redis, deps.keys, run_id)
    end_turn_without_harness(
        deps.redis,
        deps.keys,
        deps.store,
        deps.settings.stream_maxlen,
        run_id,
        turn,
        harness,
        session_error(error, "worker-lost"),
        run_status="failed",
        drain_s=REDIS_PATIENCE_S,
    )
    if harness:  # without one (the task's internal-error path) execute_turn counted the turn
        metrics.turn_failed(harness, "worker-lost")
    log.warning("turn.worker_lost", extra={"run_id": run_id, "turn": turn})
    return "worker-lost"


def _retry_redis(fn: Callable[[], Any], patience_s: float = REDIS_PATIENCE_S) -> Any:
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
