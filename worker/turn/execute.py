"""One turn of a run, from a decoded payload to its terminal event. Knows nothing of Celery.

The turn's life (claim, heartbeat, credential, Redis patience, the one terminal writer) is
:mod:`worker.turn.life`'s; this module is the procedure: check, prepare the sandbox, run the
harness (again, fresh, when its resume is rejected), and close. A redelivered turn never runs
the harness twice: the first delivery claims it; a later one finds the mark and either sees
the turn finished, sees its owner alive, or (owner dead) closes it with ``worker-lost``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import adapters
import worker.gateway.turn as gateway_turn
import worker.tools.turn as turn_tools
from adapters.events import (
    TERMINAL_TYPES,
    Event,
    SandboxActivity,
    Session,
    SessionError,
    TurnComplete,
    TurnStarted,
    Usage,
    session_error,
)
from adapters.protocol import Attachment, TurnRequest
from adapters.stream import StreamDriver
from sandbox.base import (
    LABEL_LEASE,
    LABEL_WORKER,
    Egress,
    Limits,
    Placement,
    RunSpec,
    Sandbox,
    SandboxError,
    SeedUnreachable,
)
from sandbox.network import egress_labels
from worker.control.delivery import after_turn as deliver_messages
from worker.control.messages import Message
from worker.deps import Shutdown, TurnDeps
from worker.errors import InvalidInput
from worker.gateway.route import WireTotals
from worker.gateway.standins import StandIns
from worker.observe import harness_telemetry, logs, metrics, tracing
from worker.observe.masking import Masker
from worker.options.policy import (
    Resolved,
    attachment_warning,
    check_input,
    check_schema,
    egress_allowlist,
    fit_request,
    resolve,
    resolve_secrets,
)
from worker.options.spec import RunOptions, TurnPayload
from worker.outcomes import loop as outcomes
from worker.permissions import requests as permissions
from worker.spend import budgets, parking, slots
from worker.store import credentials, queued
from worker.store.credentials import CREDENTIAL_ENV
from worker.store.publisher import RedisStreamPublisher, last_seq
from worker.store.records import RecordChanges, RunRecord
from worker.store.status import RunStatus
from worker.store.terminal import TurnRef, end_unclaimed_turn
from worker.turn import attempt, structured
from worker.turn.life import TurnLife
from worker.turn.process import explain_kill, run_process
from worker.turn.stall import Stall
from worker.turn.steering import Steering
from worker.workspace import attachments as workspace_attachments
from worker.workspace import steps as workspace_steps

__all__ = ["Shutdown", "TurnDeps", "close_lost_turn", "execute_turn"]

log = logging.getLogger(__name__)

MAX_DENIAL_EVENTS = 100
"""At most this many ``network`` activities per turn (a harness looping on a refused host
would otherwise flood its stream); the metric counts every denial."""


def execute_turn(deps: TurnDeps, payload: TurnPayload, delivery: str | None = None) -> str:
    """Run one turn to its terminal event. Returns a short outcome label for logs and Flower.

    Redis errors before the turn is claimed propagate (nothing happened: the delivery may be
    tried again, and ``delivery`` lets the retry recognise a claim whose reply was lost).
    Once claimed, the turn is ended here on every path, an error of the worker included.
    """
    run_id, turn = payload.run_id, payload.turn
    # The one read of the record a turn makes before it runs: what it uses of it (options,
    # the spend so far, the session to resume, the container, the listing identity) was
    # written by earlier turns, all ended before this one was begun.
    record = deps.store.find(run_id)
    options = record.options if record is not None else None
    if record is None or options is None:
        log.warning("turn.unknown_run", extra={"run_id": run_id, "turn": turn})
        return "unknown-run"

    life = TurnLife(deps, run_id, turn, options.harness, record)
    if parking.defer_if_early(deps, payload):
        return "deferred"
    hold = slots.take(deps, payload, options, token=life.token_for(delivery))
    if hold is None:
        return "waiting-for-slot"
    if not life.claim(delivery):
        hold.release()
        return _redelivered(deps, run_id, turn, options)

    logs.bind(harness=options.harness)
    log.info("turn.started", extra={"run_id": run_id, "turn": turn, "harness": options.harness})
    started, outcome = metrics.turn_started(options.harness), "failed:internal"
    deps.shutdown.enter()
    try:
        # Claimed: from here on every path ends the turn and releases it (a Redis error too).
        if record.status == "parked":
            life.patience.call(lambda: parking.resumed(deps, run_id, turn))
        entry = queued.entry_of(life.claimed.queued)
        if entry is not None:
            tracing.past_span("queue wait", entry.first_sent_at, time.time())
            metrics.queue_waited(options.harness, time.time() - entry.first_sent_at)
        outcome = _run(deps, payload, options, record, life)
    except Exception as exc:
        log.exception("turn.internal_error", extra={"run_id": run_id, "turn": turn})
        if not life.ended:
            try:
                outcome = life.end_internal(exc)
            except Exception:
                # Redis stayed away past the turn's patience: nothing can be written now. The
                # owner heartbeat lapses and the reaper closes the turn once Redis is back.
                log.exception("turn.internal_error_unrecorded", extra={"run_id": run_id})
    finally:
        deps.shutdown.leave()
        metrics.turn_finished(options.harness, outcome, started)
        life.release()
        hold.release()
        if life.ended:
            deliver_messages(deps, run_id, turn)
    return outcome


def _run(
    deps: TurnDeps, payload: TurnPayload, options: RunOptions, record: RunRecord, life: TurnLife
) -> str:
    """The steps of a claimed turn: admit it, prepare its workspace and sandbox, run the
    harness (again, fresh, when its resume is rejected), record what it did, and close."""
    with tracing.turn_span(options.harness, payload.run_id, payload.turn, options.model):
        run = _TurnRun(deps, payload, options, life, record.tenant)
        admitted = run.admit(record)
        if isinstance(admitted, str):
            return admitted
        resolved, secrets = admitted
        refused = run.check_tools()
        if refused is not None:
            return refused
        prepared = run.prepare(record, resolved)
        if isinstance(prepared, str):
            return prepared
        sandbox, placement, work = prepared
        request = run.request(record, resolved, placement, secrets)
        try:
            with (
                run.serve_tools(request, placement, work) as request,
                run.serve_models(request, placement, work, resolved) as request,
            ):
                terminal, driver = run.run_harness(request, sandbox, placement, secrets, resolved)
        except turn_tools.EndpointRefused as exc:  # raised before the harness starts
            return run.refuse(session_error(str(exc), "sandbox"))
        return run.finish(terminal, driver, record, resolved, sandbox, work)


class _Refused(Exception):
    """A step refused the turn; ``label`` is the turn's outcome, already closed."""

    def __init__(self, label: str) -> None:
        self.label = label


class _TurnRun:
    """One claimed turn's state across its steps (:func:`_run`)."""

    def __init__(
        self,
        deps: TurnDeps,
        payload: TurnPayload,
        options: RunOptions,
        life: TurnLife,
        tenant: str | None,
    ) -> None:
        self.deps, self.payload, self.options, self.life = deps, payload, options, life
        self.tenant = tenant
        """The run's API tenant: the names its producer chose (tool sets, a durable
        workspace) are that tenant's own (worker/options/tenant_names.py)."""
        self.run_id, self.turn = payload.run_id, payload.turn
        self.wait = life.patience.call
        self.adapter = adapters.get(options.harness)
        self.out = attempt.Publishing(self._publisher(Masker()))
        self.out.on_session = self._announced
        life.usage = self.out.usage.as_tuple
        self.header = TurnStarted(
            harness=options.harness,
            attempt=1,
            input_chars=len(payload.input),
            trace_id=tracing.trace_id(),
        )
        self.guard: budgets.Guard | None = None
        self.work_began = 0.0
        self.schema = payload.output_schema or options.output_schema
        self.attachments: tuple[Attachment, ...] = ()
        self.models = gateway_turn.Plan(None, {}, StandIns())
        """The turn's model keys and their route (:mod:`worker.gateway`)."""
        self.credential = ""
        self.wire_halt: SessionError | None = None
        """Why the model gateway stopped the turn (a rate limit, a quota, a budget)."""
        self.wire: WireTotals | None = None
        """What the model gateway counted this turn (None: the turn had no route)."""
        self.replayed: Usage | None = None
        """A fork's first turn: the estimated tokens of the conversation it replays."""
        self.rewinds_pending = True
        """Whether rewinds may wait to be told after ``turn-started``: known once the turn
        has waited for any rewind under way (:meth:`prepare`); until then, they are looked
        for."""

    def _publisher(self, masker: Masker) -> RedisStreamPublisher:
        deps = self.deps
        return RedisStreamPublisher(
            deps.redis,
            deps.keys,
            self.run_id,
            self.turn,
            maxlen=deps.settings.stream_maxlen,
            masker=masker,
        )

    def _announced(self, session: Session) -> None:
        """The harness named its session: the record keeps it from now on, so a turn whose
        worker is lost before its end still leaves it for the next turn to resume."""
        mask = self.out.publisher.masker.mask
        changes = RecordChanges(session_id=mask(session.session_id), resumed=session.resumed)
        if session.model:
            changes["model_reported"] = mask(session.model)
        self.life.record_now(changes)

    def started(self) -> None:
        """The turn has published its ``turn-started``: its terminal continues that stream,
        after the rewinds done since the last turn."""
        deps = self.deps
        self.life.publisher = self.out.publisher
        if self.replayed is not None:
            self.out.send([self.replayed])
        if self.payload.messages:
            sent = [Message.model_validate(m) for m in self.payload.messages]
            self.out.send([m.event("emulated" if m.emulated else "next-turn") for m in sent])
        if self.rewinds_pending:
            self.out.send(
                self.wait(lambda: workspace_steps.take_rewinds(deps.redis, deps.keys, self.run_id))
            )

    def refuse(self, error: SessionError, *, run_status: RunStatus = "idle") -> str:
        tracing.record_turn(
            outcome=f"failed:{error.reason}", input_tokens=0, output_tokens=0, session_id=None,
            model=None,
        )  # fmt: skip
        self.out.send([self.header])
        self.started()
        self._discard_uploads()
        return _close(
            self.payload, self.out, self.life, error, run_status=run_status, final_text=None
        )

    def _carry_attachments(self, work: workspace_steps.RunWorkspace, next_turn: int) -> None:
        """The parked retry gets this turn's attachments again (its message names them)."""
        deps, refs = self.deps, self.payload.attachments
        carried = self.wait(
            lambda: workspace_attachments.carry(
                workspace_steps.binary_client_for(deps.settings.redis_url),
                deps.keys,
                work,
                self.turn,
                next_turn,
                refs,
                deps.settings.retention_s,
            )
        )
        if not carried:
            log.warning("attachments.not_carried", extra={"run_id": self.run_id, "turn": self.turn})

    def _discard_uploads(self) -> None:
        """A refused turn's attachments leave Redis now (the ones read already are gone)."""
        deps, count = self.deps, len(self.payload.attachments)
        if count:
            keys = [deps.keys.attachment(self.run_id, self.turn, i) for i in range(count)]
            self.wait(lambda: deps.redis.delete(*keys))

    # -- admit: cancelled, policy, input, budget; then the credential -----------------------

    def admit(self, record: RunRecord) -> str | tuple[Resolved, dict[str, str]]:
        deps, settings, run_id = self.deps, self.deps.settings, self.run_id
        # A cancel marked by the time of the claim; one marked later is the read loop's.
        if self.life.claimed.cancelled:
            return self.refuse(
                session_error("the turn was cancelled before it started", "cancelled")
            )
        try:
            resolved = resolve(self.options, settings)
            check_input(self.payload.input, settings)
            check_schema(self.schema, settings)
            secrets = resolve_secrets(self.options, settings)
            self.models = gateway_turn.plan(self.options, settings, secrets)
        except InvalidInput as exc:
            return self.refuse(
                session_error(str(exc), "invalid-input"),
                run_status=_status_after_refusal(self.turn),
            )
        over = budgets.refusal(record, settings)
        if over is not None:
            metrics.budget_stopped(self.options.harness, over.budget, "before")
            self.wait(lambda: deps.store.update(run_id, budget_exceeded=over.exceeded))
            return self.refuse(over.error("before the turn"))
        self.guard = budgets.Guard(record, settings)
        if self.guard.active:
            self.out.guard = self.guard
        secrets[CREDENTIAL_ENV] = self.credential = self.life.issue_credential()
        # Masked wherever they appear: the real keys (which never enter the sandbox while the
        # gateway routes them) and their stand-ins.
        masked = [*secrets.values(), *self.models.standins.by_name.values()]
        logs.mask({str(i): value for i, value in enumerate(masked)})
        self.out.publisher = self._publisher(Masker(masked))
        return resolved, self.models.sandbox_secrets(secrets)

    # -- prepare: the run's host, its workspace (seeded on turn 1), its sandbox ---------------

    def prepare(
        self, record: RunRecord, resolved: Resolved
    ) -> str | tuple[Sandbox, Placement, workspace_steps.RunWorkspace]:
        deps, run_id = self.deps, self.run_id
        sandbox = deps.sandbox_for(resolved.sandbox)
        host_queue = deps.host_queues.get(sandbox.backend) or record.queue
        if host_queue != record.queue:
            # Before the container exists: should this worker die while it is made, the run's
            # next turn must come to this host (and find it), not start a second one elsewhere.
            self.wait(lambda: deps.store.update(run_id, queue=host_queue))
        work = workspace_steps.run_workspace(
            sandbox, run_id, self.options, deps.settings, tenant=self.tenant
        )
        self.rewinds_pending = self.wait(
            lambda: workspace_steps.wait_for_rewind(deps.redis, deps.keys, run_id)
        )
        seeded = None
        if self.turn == 1:
            try:
                with tracing.span("seed workspace"):
                    seeded = workspace_steps.seed_first_turn(deps, run_id, work, self.options)
            except InvalidInput as exc:
                self.life.revoke_credential()
                return self.refuse(session_error(str(exc), "invalid-input"), run_status="failed")
            except SeedUnreachable as exc:
                # The repository could not be read now: a new run may well succeed.
                self.life.revoke_credential()
                return self.refuse(
                    session_error(f"the workspace could not be seeded: {exc}", "sandbox"),
                    run_status="failed",
                )
        try:
            with tracing.span("prepare sandbox", {"harness.sandbox": sandbox.backend}):
                placement = self._place(sandbox, resolved, record, work.key)
        except _Refused as refused:
            return refused.label
        self._record_placement(placement, resolved, record, seeded or RecordChanges())
        try:
            self.attachments = workspace_attachments.place(
                workspace_steps.binary_client_for(deps.settings.redis_url),
                deps.keys,
                work,
                self.turn,
                self.payload.attachments,
                deps.settings,
            )
        except InvalidInput as exc:
            return self.refuse(
                session_error(str(exc), "invalid-input"),
                run_status=_status_after_refusal(self.turn),
            )
        return sandbox, placement, work

    def _place(
        self, sandbox: Sandbox, resolved: Resolved, record: RunRecord, workspace_key: str | None
    ) -> Placement:
        deps, settings, run_id, options = self.deps, self.deps.settings, self.run_id, self.options
        lease_until = time.time() + settings.run_lease_s
        self.lease_until = lease_until
        try:
            placement = sandbox.prepare(
                RunSpec(
                    run_id=run_id,
                    image=resolved.image,
                    network=resolved.network,  # type: ignore[arg-type]
                    limits=Limits(resolved.memory, resolved.cpus, resolved.pids),
                    user=settings.container_user,
                    read_only_root=settings.read_only_root,
                    workspace_key=workspace_key,
                    labels={
                        LABEL_WORKER: deps.worker_id,
                        LABEL_LEASE: f"{lease_until:.0f}",
                        **_egress_labels(resolved.network, options),
                    },
                )
            )
            sandbox.renew(run_id, lease_until)
        except SandboxError as exc:
            log.warning(
                "sandbox.prepare_failed",
                extra={
                    "run_id": run_id,
                    "turn": self.turn,
                    "backend": sandbox.backend,
                    "error": str(exc),
                },
            )
            first_and_alone = self.turn == 1 and not record.container_id
            if first_and_alone:
                # Nothing of the run exists yet but what this attempt left: remove it.
                sandbox.teardown(run_id, keep_workspace=options.workspace is not None)
                self.life.revoke_credential()
            raise _Refused(
                self.refuse(
                    session_error(f"the sandbox could not be prepared: {exc}", "sandbox"),
                    run_status="failed" if first_and_alone else "idle",
                )
            ) from exc
        return placement

    def _record_placement(
        self, placement: Placement, resolved: Resolved, record: RunRecord, seeded: RecordChanges
    ) -> None:
        """Where the run's sandbox is, with what the first turn's seed recorded, in one
        write (a new run's first also moves it to ``running``)."""
        deps, settings, run_id = self.deps, self.deps.settings, self.run_id
        egress_allow = (
            egress_allowlist(settings, self.options.harness, self.options.base_url)
            if resolved.network == "egress"
            else None
        )
        changes = RecordChanges(
            **seeded,
            container_id=placement.container_id,
            lease_until=self.lease_until,
            sandbox=placement.backend,
            network=resolved.network,
            egress_allow=egress_allow,
        )
        if record.status == "starting":  # a new run's first turn (no later turn starts it)
            self.wait(lambda: deps.store.mark_running(run_id, **changes))
        else:
            self.wait(lambda: deps.store.update(run_id, **changes))
        log.info(
            "sandbox.ready",
            extra={"backend": placement.backend, "container": placement.container_id},
        )

    def request(
        self,
        record: RunRecord,
        resolved: Resolved,
        placement: Placement,
        secrets: dict[str, str],
    ) -> TurnRequest:
        given = dataclasses.replace(
            _request(self.options, self.payload, placement, record, resolved.executable, secrets),
            attachments=self.attachments,
            output_schema=self.schema,
        )
        request = fit_request(given, self.adapter.CAPABILITIES)
        if self.turn == 1 and record.forked_from:
            # A fork's first turn: the parent's turns up to the fork, replayed (worker/client/
            # forks.py); its usage is published once the turn has started.
            replayed = _replay_text(
                self.wait(lambda: self.deps.store.transcript(self.run_id)), FORKED
            )
            if replayed:
                request = dataclasses.replace(request, input=f"{replayed}{request.input}")
                self.replayed = Usage(input_tokens=math.ceil(len(replayed) / 4), source="replay")
        as_files = attachment_warning(given, self.adapter.CAPABILITIES)
        warnings = list(resolved.warnings) if self.turn == 1 else list(record.warnings or [])
        if as_files:
            warnings.append(as_files)
        if not (self.turn == 1 or as_files):
            return request
        # A new run's record holds the producer's warnings: this worker's policy decides.
        if warnings != (record.warnings or []):
            self.wait(lambda: self.deps.store.update(self.run_id, warnings=warnings or None))
        if warnings:
            log.warning(
                "turn.policy_not_enforced", extra={"run_id": self.run_id, "warnings": warnings}
            )
        return request

    # -- run the harness: once, and again fresh when its resume is rejected -------------------

    def run_harness(
        self,
        request: TurnRequest,
        sandbox: Sandbox,
        placement: Placement,
        secrets: dict[str, str],
        resolved: Resolved,
    ) -> tuple[Event, StreamDriver]:
        deps, settings, out, run_id = self.deps, self.deps.settings, self.out, self.run_id
        assert self.guard is not None
        limits = attempt.Limits(
            time.monotonic() + resolved.timeout_s,
            settings.idle_timeout_s,
            settings.exit_grace_s,
            settings.kill_grace_s,
            settings.max_line_bytes,
            settings.coalesce_text_chars,
        )
        stop = self.guard.stop_check(self.life.stop_check(), out)
        self.work_began = time.time()
        gate = permissions.gate_for(deps, run_id, self.turn, self.options, out.publisher.masker)
        out.steering = steering = Steering(
            deps.redis, deps.keys, run_id, self.turn, out,
            int(settings.retention_s + settings.run_lease_s),
        )  # fmt: skip

        # In the turn's span: the harness's own spans are its children.
        telemetry = harness_telemetry.for_turn(self.options.harness, settings)
        stall = Stall(
            sandbox, run_id, self.turn, lambda: out.last_event,
            redis=deps.redis, keys=deps.keys, report_after_s=settings.stall_report_s,
        )  # fmt: skip

        def one(req: TurnRequest, number: int) -> tuple[attempt.Outcome, StreamDriver]:
            with tracing.span("exec", {"harness.attempt": number}):
                return run_process(
                    self.adapter, req, sandbox, placement, secrets, out, limits, stop, number,
                    self.started, gate, telemetry, self.header.trace_id, stall,
                    self.life.confirm_hold,
                )  # fmt: skip

        try:
            outcome, driver = one(request, 1)
            terminal = explain_kill(outcome.terminal, sandbox, run_id)
            if (
                isinstance(terminal, SessionError)
                and request.resume_session
                and driver.state.resume_rejected
            ):
                log.info("turn.resume_rejected", extra={"run_id": run_id, "turn": self.turn})
                replayed = _replay_text(self.wait(lambda: deps.store.transcript(run_id)))
                fresh = dataclasses.replace(
                    request,
                    resume_session=None,
                    input=f"{replayed}{request.input}" if replayed else request.input,
                )
                if replayed:
                    out.send([Usage(input_tokens=math.ceil(len(replayed) / 4), source="replay")])
                outcome, driver = one(fresh, 2)
                terminal = outcome.terminal
            return terminal, driver
        finally:
            steering.close()

    # -- tools: the run's MCP endpoint while the harness runs (worker/tools/) -----------------

    def check_tools(self) -> str | None:
        """Refused (the outcome) when the run attached servers it may not have."""
        try:
            turn_tools.check(self.options, self.deps.settings)
        except InvalidInput as exc:
            self.life.revoke_credential()
            return self.refuse(
                session_error(str(exc), "invalid-input"),
                run_status=_status_after_refusal(self.turn),
            )
        return None

    @contextlib.contextmanager
    def serve_tools(
        self, request: TurnRequest, placement: Placement, work: workspace_steps.RunWorkspace
    ) -> Iterator[TurnRequest]:
        """The request with the run's servers, their endpoint open while the block runs; its
        last ``tool-call``/``tool-result`` events published after it, before the terminal."""
        with turn_tools.serve(
            self.deps, self.run_id, self.turn, self.options, placement, work.path,
            self.out.publisher.masker, tenant=self.tenant,
        ) as tools:  # fmt: skip
            if tools is not None:
                self.out.tools = tools.endpoint
                request = dataclasses.replace(request, mcp_servers=tools.servers)
            try:
                yield request
            finally:
                self.out.tools = None
        if tools is not None:
            self.out.send(tools.drain())
            if tools.endpoint.calls:  # harness status shows them
                made = tools.endpoint.calls
                held = self.wait(lambda: self.deps.store.record(self.run_id)).tool_calls
                self.wait(lambda: self.deps.store.update(self.run_id, tool_calls=held + made))

    # -- models: the turn's route through the model gateway (worker/gateway/) -----------------

    @contextlib.contextmanager
    def serve_models(
        self,
        request: TurnRequest,
        placement: Placement,
        work: workspace_steps.RunWorkspace,
        resolved: Resolved,
    ) -> Iterator[TurnRequest]:
        """The request pointed at the turn's route, open while the block runs; what it
        metered published after it, before the terminal."""
        deps, guard, out = self.deps, self.guard, self.out
        assert guard is not None
        token = self.credential

        def alive() -> bool:
            return credentials.verify(deps.redis, deps.keys, self.run_id, token)

        with gateway_turn.serve(
            self.models, self.options, deps.settings, request, placement, work.path,
            run_id=self.run_id, network=resolved.network, alive=alive,
            over_budget=lambda wire: guard.at_gateway(wire.tokens, out.usage),
        ) as routed:  # fmt: skip
            if routed is None:
                yield request
                return
            out.wire = routed.route
            try:
                yield routed.request
            finally:
                out.wire = None
        out.send(routed.route.drain())
        self.wire = routed.route.totals
        self.wire_halt = routed.route.halt

    # -- finish: what the turn did, then its one terminal -----------------------------------

    def finish(
        self,
        terminal: Event,
        driver: StreamDriver,
        record: RunRecord,
        resolved: Resolved,
        sandbox: Sandbox,
        work: workspace_steps.RunWorkspace,
    ) -> str:
        deps, settings, out, run_id, turn = (
            self.deps, self.deps.settings, self.out, self.run_id, self.turn
        )  # fmt: skip
        assert self.guard is not None
        terminal = structured.check(terminal, self.schema)
        terminal = gateway_turn.verdict(terminal, self.wire_halt)
        if isinstance(terminal, SessionError) and terminal.reason == "shutdown":
            # This worker is going away; the run keeps its container and host queue, and its
            # next turn waits for a worker there. The credential goes with this worker.
            self.life.revoke_credential()
        if isinstance(terminal, SessionError) and terminal.reason == "sandbox":
            log.warning(
                "sandbox.turn_failed",
                extra={"run_id": run_id, "turn": turn, "error": terminal.error},
            )
        if resolved.network == "egress":
            _publish_denials(sandbox, run_id, self.work_began, out, self.options.harness)
        if settings.snapshots or self.options.push_branch:
            with tracing.span("snapshot"):
                change = workspace_steps.after_turn(
                    work, turn, self.payload.input, self.options, settings
                )
            out.send([change])
            if change.snapshot:
                self.life.changes["snapshot"] = change.snapshot
        guard, graded = self.guard, RecordChanges()
        if isinstance(terminal, TurnComplete) and outcomes.graded(record):
            graded = outcomes.evaluate(
                outcomes.GradedTurn(deps, record, turn, terminal.text, work, out.send,
                                    out.publisher.masker.mask,
                                    lambda: guard.next_turn_refusal(out.usage)),
                run_turn=execute_turn,
            )  # fmt: skip
        final_text = terminal.text if isinstance(terminal, TurnComplete) else None
        if isinstance(terminal, SessionError) and terminal.reason == "cancelled":
            # Stopped mid-turn (a cancel, an interrupt, a steer it could not take): the model
            # saw the input, and a later turn that cannot resume the session replays it too.
            final_text = ""
        refused_next = self.guard.next_turn_refusal(out.usage) is not None
        with tracing.span("park") as park_span:
            parked = parking.park(deps, self.payload, self.options, record, terminal, refused_next)
            if parked is not None:
                park_span.set_attributes({"harness.resume_at": parked.resume_at})
                metrics.parked(self.options.harness, parked.reason)
        if parked is not None:
            self._carry_attachments(work, parked.next_turn)
            out.send([parked.event])  # before the terminal: the turn's retry is scheduled
        spend = self.guard.changes()
        spend.update(graded)
        if self.wire is not None:
            spend.update(gateway_turn.record_changes(record, self.wire, out.publisher.masker))
        if not out.sessions and driver.state.session_id:
            # A turn stopped before the harness published its session (a budget, a cancel, a
            # timeout; gemini names it only with its result): the id the harness announced is
            # still what the next turn resumes.
            spend["session_id"] = out.publisher.masker.mask(driver.state.session_id)
        _record_turn(terminal, out, driver)
        _count_budget(self.options.harness, self.guard, out)
        label = _close(
            self.payload,
            out,
            self.life,
            terminal,
            run_status="parked" if parked is not None else "idle",
            final_text=final_text,
            carry=driver.state.carry,
            spend=spend,
        )
        if parked is not None:
            parking.dispatch(deps, parked)
        return label


def _record_turn(terminal: Event, out: attempt.Publishing, driver: StreamDriver) -> None:
    """What the harness reported, on the turn's span (masked as the run record keeps it)."""
    if not tracing.enabled():
        return
    mask = out.publisher.masker.mask
    session = terminal.session_id if isinstance(terminal, TurnComplete) else None
    model = terminal.model if isinstance(terminal, TurnComplete) else None
    for announced in out.sessions:
        session, model = session or announced.session_id, model or announced.model
    session = session or driver.state.session_id
    reason = terminal.reason if isinstance(terminal, SessionError) else None
    tracing.record_turn(
        outcome="completed" if reason is None else f"failed:{reason}",
        input_tokens=out.usage.input_tokens,
        output_tokens=out.usage.output_tokens,
        session_id=mask(session) if session else None,
        model=mask(model) if model else None,
    )


def _count_budget(harness: str, guard: budgets.Guard, out: attempt.Publishing) -> None:
    """A budget that stopped the harness, or that this turn spent for the next."""
    if guard.over is not None:
        metrics.budget_stopped(harness, guard.over.budget, "during")
        return
    over = guard.next_turn_refusal(out.usage)
    if over is not None:
        metrics.budget_stopped(harness, over.budget, "after")


def _egress_labels(network: str, options: RunOptions) -> dict[str, str]:
    """What the egress gateway applies to the run's container: its harness's allowlist, and
    its base URL's endpoint (allowed when policy allows producer endpoints)."""
    if network != "egress":
        return {}
    return egress_labels(options.harness, options.base_url)


def _publish_denials(
    sandbox: Sandbox, run_id: str, since: float, out: attempt.Publishing, harness: str
) -> None:
    """The connections the egress gateway refused during the turn's work, as ``network``
    activities before its terminal event (at most ``MAX_DENIAL_EVENTS``; all are counted)."""
    if not isinstance(sandbox, Egress):
        return
    try:
        denials = sandbox.network_denials(run_id, since, time.time())
    except SandboxError as exc:
        log.warning("egress.denials_unread", extra={"run_id": run_id, "error": str(exc)})
        return
    if not denials:
        return
    metrics.egress_denied(harness, [d.rule for d in denials])
    log.info("egress.denied", extra={"run_id": run_id, "count": len(denials)})
    out.send(
        [
            SandboxActivity(
                kind="network", description=d.describe(), host=d.host, port=d.port, denied=True
            )
            for d in denials[:MAX_DENIAL_EVENTS]
        ]
    )


def _request(
    options: RunOptions,
    payload: TurnPayload,
    placement: Placement,
    record: RunRecord,
    executable: str | None,
    secrets: dict[str, str],
) -> TurnRequest:
    resume = options.resume_session if payload.turn == 1 else record.session_id or None
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
        carry=record.carry,
    )


RESUME_FAILED = "[The previous session could not be resumed. The conversation so far:]"
FORKED = "[This conversation continues an earlier one. The conversation so far:]"


def _replay_text(transcript: list[dict[str, Any]], header: str = RESUME_FAILED) -> str:
    if not transcript:
        return ""
    parts = [header]
    for entry in transcript:
        parts.append(f"[user]\n{entry.get('input', '')}")
        if entry.get("output"):
            parts.append(f"[assistant]\n{entry['output']}")
    parts.append("[user]\n")
    return "\n\n".join(parts)


def _status_after_refusal(turn: int) -> RunStatus:
    return "failed" if turn == 1 else "idle"


def _close(
    payload: TurnPayload,
    out: attempt.Publishing,
    life: TurnLife,
    terminal: Event,
    *,
    run_status: RunStatus,
    final_text: str | None,
    carry: dict[str, Any] | None = None,
    spend: dict[str, Any] | None = None,
) -> str:
    """The facts the run record keeps of this turn, then its one terminal event."""
    # Everything the harness said may carry a granted value it printed: mask what Redis keeps.
    mask = out.publisher.masker.mask
    changes = RecordChanges()
    if carry:
        changes["carry"] = carry
    if spend:
        changes.update(spend)  # type: ignore[typeddict-item]
    # The sessions the harness announced are the life's changes already (_TurnRun._announced).
    if isinstance(terminal, TurnComplete):
        if terminal.session_id:
            changes["session_id"] = mask(terminal.session_id)
        if terminal.model:
            changes["model_reported"] = mask(terminal.model)
        changes.setdefault("last_error", None)  # an outcome's grader may have set one
    elif isinstance(terminal, SessionError):
        changes["last_error"] = mask(f"{terminal.reason}: {terminal.error}")
    # The transcript is replayed into a fresh session later: keep granted values out of it.
    transcript = None if final_text is None else (mask(payload.input), mask(final_text))
    return life.end(terminal, run_status=run_status, changes=changes, transcript=transcript)


def _redelivered(deps: TurnDeps, run_id: str, turn: int, options: RunOptions) -> str:
    """A turn some worker already took: finished, in flight, or orphaned by a dead worker."""
    _, last_type = last_seq(deps.redis, deps.keys, run_id, turn)
    if last_type in TERMINAL_TYPES:
        log.info("turn.duplicate_ignored", extra={"run_id": run_id, "turn": turn})
        return "duplicate"
    if deps.redis.exists(deps.keys.turn_owner(run_id, turn)):
        log.info("turn.duplicate_in_flight", extra={"run_id": run_id, "turn": turn})
        return "duplicate"
    return close_lost_turn(deps, run_id, turn, options.harness)


def close_lost_turn(
    deps: TurnDeps,
    run_id: str,
    turn: int,
    harness: str,
    error: str = "the worker running this turn was lost",
) -> str:
    """Give a turn whose worker died its one terminal event (reason ``worker-lost``).

    The run stays usable: its sandbox and workspace are kept (the next turn in that container
    first stops whatever the lost turn left running). Only once the end script has ended the
    turn are its pending permission requests denied and its credential revoked (its own, not
    a later turn's): a close that finds the turn owned after all (its worker renewed its
    hold), or ended already (a redelivered copy of an old turn), touches nothing.
    """
    ref = TurnRef(deps.redis, deps.keys, deps.store, deps.settings, run_id, turn, harness)
    if not end_unclaimed_turn(
        ref, session_error(error, "worker-lost"), caller="lost", patience_s=600.0
    ):
        return "duplicate"
    credentials.revoke(deps.redis, deps.keys, run_id, through=turn)
    permissions.close_turn(deps.redis, deps.keys, run_id, turn, "worker:worker-lost")
    metrics.turn_failed(harness, "worker-lost")
    log.warning("turn.worker_lost", extra={"run_id": run_id, "turn": turn})
    deliver_messages(deps, run_id, turn)
    return "worker-lost"
