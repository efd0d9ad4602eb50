"""One harness process of a turn: its command built, started in the sandbox and driven to its
terminal event by the read loop (:func:`worker.turn.attempt.drive`); always left dead."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from adapters.events import Event, SessionError, TurnStarted, session_error
from adapters.protocol import Adapter, AdapterState, TurnRequest
from adapters.stream import StreamDriver
from sandbox.base import ExecSpec, Placement, Sandbox, SandboxError
from worker.observe import harness_telemetry
from worker.permissions import requests as permissions
from worker.turn import attempt
from worker.turn.stall import Stall

log = logging.getLogger(__name__)


def explain_kill(terminal: Event, sandbox: Sandbox, run_id: str) -> Event:
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


def run_process(
    adapter: Adapter[AdapterState],
    request: TurnRequest,
    sandbox: Sandbox,
    placement: Placement,
    secrets: dict[str, str],
    out: attempt.Publishing,
    limits: attempt.Limits,
    stop: Callable[[], SessionError | None],
    number: int,
    started: Callable[[], None],
    gate: permissions.Gate | None = None,
    telemetry: harness_telemetry.ExecTelemetry | None = None,
    trace_id: str | None = None,
    stall: Stall | None = None,
    may_start: Callable[[], SessionError | None] | None = None,
) -> tuple[attempt.Outcome, StreamDriver]:
    """One harness process of the turn. ``may_start``, asked last before the process starts,
    refuses it with the turn's end (the worker no longer holds the turn)."""
    driver = StreamDriver(
        adapter,
        request,
        attempt=number,
        max_line_bytes=limits.max_line_bytes,
        coalesce_chars=limits.coalesce_text_chars,
    )
    head = driver.start()
    if number == 1:
        out.send([traced(event, trace_id) for event in head])
        started()
    try:
        command = adapter.build_command(request)
    except ValueError as exc:
        return no_process(
            driver, session_error(f"cannot build the command: {exc}", "invalid-input")
        )
    env, files = (telemetry or harness_telemetry.ExecTelemetry()).apply(command.env, command.files)
    spec = ExecSpec(
        argv=tuple(command.argv),
        stdin=command.stdin,
        env=env,
        files=files,
        cwd=command.cwd,
        keep_stdin=command.keep_stdin,
    )
    if out.wire is not None:
        spec = out.wire.wrap(spec)
    refusal = may_start() if may_start is not None else None
    if refusal is not None:
        return no_process(driver, refusal)
    try:
        process = sandbox.start(placement, spec, secrets)
    except SandboxError as exc:
        return no_process(
            driver, session_error(f"the harness could not be started: {exc}", "sandbox")
        )
    log.info("harness.started", extra={"attempt": number, "executable": spec.argv[0]})
    try:
        if gate is not None:
            gate.attach(adapter, driver.state, process)
        if out.steering is not None:
            out.steering.attach(adapter, driver.state, process)
        outcome = attempt.drive(process, driver, out, limits, stop, gate, stall)
        log.info("harness.exited", extra={"attempt": number, "exit_code": outcome.exit_code})
    except SandboxError as exc:
        with contextlib.suppress(SandboxError):
            process.kill(grace=limits.kill_grace_s)
        problem = sandbox.diagnose(placement.run_id) or str(exc)
        outcome, _ = no_process(
            driver, session_error(f"the sandbox failed during the turn: {problem}", "sandbox")
        )
    except BaseException:
        # An error of the worker while the harness runs: stop the harness before the turn
        # is ended as ``internal`` (the process must not outlive its turn).
        with contextlib.suppress(Exception):
            process.kill(grace=limits.kill_grace_s)
        raise
    return outcome, driver


def no_process(driver: StreamDriver, error: SessionError) -> tuple[attempt.Outcome, StreamDriver]:
    """The attempt ends with ``error`` and no exit code of a process to report."""
    driver.fail(error)
    assert driver.terminal is not None
    return attempt.Outcome(driver.terminal, None, ""), driver


def traced(event: Event, trace_id: str | None) -> Event:
    if trace_id is None or not isinstance(event, TurnStarted):
        return event
    return event.model_copy(update={"trace_id": trace_id})
