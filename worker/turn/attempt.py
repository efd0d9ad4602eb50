"""One harness process, from start to its terminal event: the read loop of a turn.

Output is fed to the stream driver as it arrives and published chunk by chunk; the terminal
event is held back and returned, so the caller can update the run record (or retry fresh
after a rejected resume) before consumers see the turn end. Cancel, turn and idle timeouts
and worker shutdown are checked here, independently of the Celery pool type.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from adapters.events import Event, Session, SessionError, TurnComplete, Usage, session_error
from adapters.protocol import Adapter, AdapterState, ExitInfo
from adapters.stream import DEFAULT_MAX_LINE_BYTES, StreamDriver
from sandbox.base import ExecSpec, Process
from worker.permissions.requests import Gate
from worker.spend.budgets import Guard, UsageTotals
from worker.store.publisher import SCRIPT_BATCH, RedisStreamPublisher
from worker.turn.stall import Stall

log = logging.getLogger(__name__)

STDERR_KEEP = 8192
POLL_S = 0.2
"""How often the read loop checks what it holds in memory (timeouts, a hold lost, shutdown,
the permission gate, the MCP endpoint's and the model route's events)."""
FALLBACK_POLL_S = 2.0
"""How often the read loop asks Redis whether the turn was cancelled or sent a message while
the bell listens (:class:`worker.turn.steering.Bell`): a cancel or a message rings it and is
taken at once, so this poll only finds one whose ring was missed (a subscription cut, Redis
restarted, a sender of an older version). Asked every POLL_S, these two commands were ten a
second per turn in flight, two thirds of the runs' Redis commands at a fleet's peak
(docs/fleet-model.md). While the bell is not listening the loop asks every POLL_S."""
BATCH_BYTES = 256 * 1024
"""Output already waiting is fed and published together up to about this much."""
FEED_BYTES = 32 * 1024
"""A batch goes through the stream driver in slices of this much."""
EXIT_AFTER_EOF_S = 0.5
"""Once the harness closed its stdout and stderr it is exiting: how long to let it finish
before it is killed. Without this wait, a process caught between closing its pipes and
being reaped was SIGTERMed (and the group scan and kill cost up to ~50 ms per turn)."""


@dataclass
class Limits:
    deadline: float
    """Monotonic time at which the turn times out."""
    idle_s: float
    exit_grace_s: float
    kill_grace_s: float
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    coalesce_text_chars: int = 0
    """Consecutive text of one batch of output published as one entry up to this many
    characters (:attr:`adapters.stream.StreamDriver.coalesce_chars`); 0: one entry per line."""


class ToolEvents(Protocol):
    @property
    def busy(self) -> bool: ...

    def drain(self) -> list[Event]: ...


BUDGET_GRACE_S = 10.0
"""How long a harness whose model request the gateway refused for a spent budget has to end
its turn itself before it is stopped."""


class WireEvents(Protocol):
    """The turn's model route (:class:`worker.gateway.route.ModelRoute`)."""

    halt: SessionError | None

    def drain(self) -> list[Event]: ...

    def wrap(self, spec: ExecSpec) -> ExecSpec: ...


class SteeringHook(Protocol):
    """The turn's incoming messages (:class:`worker.turn.steering.Steering`)."""

    def attach(
        self, adapter: Adapter[AdapterState], state: AdapterState, process: Process
    ) -> None: ...

    def poll(self) -> SessionError | None:
        """The turn's stop for a cancel or a message sent to it (Redis is asked)."""
        ...

    @property
    def rung(self) -> bool:
        """A message or a cancel came for the turn: poll now, not at the next poll interval."""
        ...

    @property
    def ringing(self) -> bool:
        """Whether a message or a cancel sent now rings (else the loop polls every POLL_S)."""
        ...


@dataclass
class Outcome:
    terminal: Event
    exit_code: int | None
    stderr_tail: str


class Publishing:
    """Publishes events as they come, keeping the facts the run record needs."""

    def __init__(self, publisher: RedisStreamPublisher) -> None:
        self.publisher = publisher
        self.usage = UsageTotals()
        self.sessions: list[Session] = []
        self.text_parts: list[str] = []
        self.guard: Guard | None = None
        """The run's budget: told each batch (:meth:`Guard.clear`) and, when a limit may be
        crossed in it, every event with the turn's usage so far (:meth:`Guard.on_event`);
        what that returns stops the harness (:attr:`halt`)."""
        self.halt: SessionError | None = None
        self.last_event: tuple[str, float] | None = None
        """The type and monotonic time of the last event sent (a stalled turn's diagnosis)."""
        self.tools: ToolEvents | None = None
        """The turn's MCP endpoint while the harness runs (:mod:`worker.tools.endpoint`):
        the read loop publishes what it queued and holds the idle clock while a call waits."""
        self._wire_halt_at = 0.0
        self.wire: WireEvents | None = None
        """The turn's model route while the harness runs (:mod:`worker.gateway`): the read
        loop publishes what it metered, and stops the harness with its halt (a rate limit
        or a budget met at the gateway)."""
        self.steering: SteeringHook | None = None
        """The messages and the cancel sent to the turn while it runs: the read loop takes
        them when they ring and at its fallback poll (a steer written to the harness, or the
        turn stopped for one)."""
        self.on_session: Callable[[Session], None] | None = None
        """Told each ``session`` event once it is handed to the publisher (the run record
        keeps it from then on, not only from the turn's end)."""

    def send_side_events(self) -> None:
        """What the turn's MCP endpoint and model route queued; the route's halt: a rate
        limit or a quota stops the harness at once, a budget the gateway refused after
        :data:`BUDGET_GRACE_S`, so that a harness told why ends its turn itself (naming its
        session, which the next turn resumes once the budget is raised)."""
        if self.tools is not None:
            self.send(self.tools.drain())
        wire = self.wire
        if wire is not None:
            self.send(wire.drain())
            halt = wire.halt
            if halt is not None and self.halt is None:
                now = time.monotonic()
                self._wire_halt_at = self._wire_halt_at or now
                if halt.reason != "budget" or now - self._wire_halt_at >= BUDGET_GRACE_S:
                    self.halt = halt

    def send(self, events: list[Event]) -> None:
        guard = self.guard if self.halt is None else None
        if guard is not None and guard.clear(events, self.usage):
            guard = None  # nothing in this batch crosses a limit
        usage, sessions = self.usage, self.sessions
        announced: list[Session] = []
        for event in events:
            if isinstance(event, Usage):
                if event.source != "gateway":  # the wire's count is the route's, beside
                    usage.add(event)
            elif isinstance(event, Session):
                announced.append(event)
            if guard is not None and self.halt is None:
                self.halt = guard.on_event(event, usage)
        if events:
            self.last_event = (events[-1].type, time.monotonic())
        self.publisher.publish(events)
        for session in announced:
            sessions.append(session)
            if self.on_session is not None:
                self.on_session(session)


def drive(
    process: Process,
    driver: StreamDriver,
    out: Publishing,
    limits: Limits,
    should_stop: Callable[[], SessionError | None],
    gate: Gate | None = None,
    stall: Stall | None = None,
) -> Outcome:
    """Run one process to the end of its turn; always leaves the process dead.

    With a ``gate`` (``--posture ask``) the harness's permission requests are published and
    answered here; while one waits the turn and idle timeouts stand still (the gate's own
    deadline runs instead). With a ``stall``, a timeout's ``session-error`` says what the
    harness was doing, and a long silence is reported while it lasts."""
    loop = _ReadLoop(process, driver, out, limits, should_stop, gate)
    loop.stall = stall
    out.send(driver.start())  # empty when the caller already published turn-started
    try:
        while not loop.should_break() and not loop.read():
            pass
    finally:
        exit_code = loop.stop_process()
    return loop.outcome(exit_code)


class _ReadLoop:
    """The state of :func:`drive` between its steps: when output last came, when the
    terminal did, why the turn stops, the stderr tail."""

    def __init__(
        self,
        process: Process,
        driver: StreamDriver,
        out: Publishing,
        limits: Limits,
        should_stop: Callable[[], SessionError | None],
        gate: Gate | None,
    ) -> None:
        self.process, self.driver, self.out, self.limits = process, driver, out, limits
        self.should_stop, self.gate = should_stop, gate
        self.stderr = bytearray()
        self.last_output = self.previous = time.monotonic()
        self.terminal_at: float | None = None
        self.next_check = 0.0
        self.next_remote = 0.0
        """When the loop next asks Redis for a cancel or a message unrung."""
        self.stop: SessionError | None = None
        self.stall: Stall | None = None

    def should_break(self) -> bool:
        """Time passes: the terminal's exit grace, a stop asked for, a timeout, EOF."""
        now = time.monotonic()
        gate, limits = self.gate, self.limits
        if gate is not None and gate.waiting:
            limits.deadline += now - self.previous
            self.last_output = now
        self.previous = now
        tools = self.out.tools
        if tools is not None and tools.busy:
            self.last_output = now  # a tool call waits: the harness is not idle
        if self.driver.done:
            if self.terminal_at is None and gate is not None:
                gate.turn_over()
            self.terminal_at = self.terminal_at or now
            return self.process.eof or now - self.terminal_at >= limits.exit_grace_s
        timed_out = now >= limits.deadline or now - self.last_output >= limits.idle_s
        steering = self.out.steering
        if steering is not None and steering.rung and self.stop is None:
            self.stop = steering.poll()
        if timed_out or now >= self.next_check:
            # A cancel (or shutdown) that came in while we were busy wins over a timeout
            # that expired meanwhile: it is what the producer asked for.
            self.next_check = now + POLL_S
            self.stop = self.should_stop() or self.stop
            remote = timed_out or now >= self.next_remote
            if self.stop is None and steering is not None and remote:
                self.next_remote = now + (FALLBACK_POLL_S if steering.ringing else POLL_S)
                self.stop = steering.poll()
            if self.stop is None and gate is not None:
                self.out.send(gate.poll())
            self.out.send_side_events()
        if self.stop is None:
            self.stop = self._timed_out(now)
        return self.stop is not None or self.process.eof

    def _timed_out(self, now: float) -> SessionError | None:
        """The turn or idle timeout, with what the harness was doing when it fired."""
        limits, stall = self.limits, self.stall
        if now >= limits.deadline:
            what = "the turn timed out"
        elif now - self.last_output >= limits.idle_s:
            what = f"the harness produced no output for {limits.idle_s:g}s"
        else:
            if stall is not None:
                stall.watch(self.last_output)
            return None
        if stall is not None:
            what = f"{what}: {stall.describe(self.last_output)}"
        return session_error(what, "timeout")

    def read(self) -> bool:
        """Read what has arrived and publish it. True when a budget crossed stops the turn."""
        process = self.process
        chunk = process.read(POLL_S)
        if chunk is None:
            return False
        self.last_output = time.monotonic()
        # Take whatever else has already arrived (never waiting for more) and publish it as
        # one batch: a Docker exec delivers output in frames of a few KiB, and one round trip
        # per frame cost more than the events in it.
        stdout: list[bytes] = []
        size = 0
        stderr = self.stderr
        while chunk is not None:
            if chunk.stream == "stdout":
                stdout.append(chunk.data)
                size += len(chunk.data)
            else:
                stderr += chunk.data
                if len(stderr) > STDERR_KEEP:
                    del stderr[: len(stderr) - STDERR_KEEP]
            chunk = process.read(0) if size < BATCH_BYTES else None
        if not stdout:
            return False
        out, driver = self.out, self.driver
        data = stdout[0] if len(stdout) == 1 else b"".join(stdout)
        # Fed a slice at a time and sent once a script call's worth of events is there: the
        # events of a whole batch alive at once (thousands of a flood's) cost more in the
        # garbage collector and the caches than the slicing does (docs/performance.md, row 2).
        events: list[Event] = []
        for at in range(0, len(data), FEED_BYTES):
            events += [e for e in driver.feed(data[at : at + FEED_BYTES]) if not e.terminal]
            if len(events) >= SCRIPT_BATCH:
                whole = len(events) - len(events) % SCRIPT_BATCH  # whole script calls only
                out.send(events[:whole])
                del events[:whole]
        events += driver.release_text()  # text read together is merged, never held back
        out.send(events)
        if self.gate is not None:
            out.send(self.gate.collect())
        out.send_side_events()
        if out.halt is not None and not driver.done:
            self.stop = out.halt  # a budget crossed: stopped at once, as a cancel is
            return True
        return False

    def stop_process(self) -> int | None:
        """Close the gate (what is pending is denied, the harness told), then let the process
        exit or kill it. Its exit code."""
        out, limits, process = self.out, self.limits, self.process
        if self.gate is not None:
            try:
                out.send(self.gate.close(self.stop))
            except Exception:  # the process must be stopped whatever happened
                log.exception("permission.close_failed", extra={"stream": out.publisher.key})
        ending = self.stop is None and process.eof
        exit_code = process.wait(min(EXIT_AFTER_EOF_S, limits.exit_grace_s) if ending else 0)
        if exit_code is None:
            process.kill(grace=limits.kill_grace_s)
            exit_code = process.wait(limits.kill_grace_s + 5)
        return exit_code

    def outcome(self, exit_code: int | None) -> Outcome:
        driver, out = self.driver, self.out
        tail = self.stderr.decode("utf-8", errors="replace")
        if self.stop is not None:
            events = driver.fail(
                self.stop.model_copy(update={"exit_code": exit_code, "stderr_tail": tail[-2000:]})
            )
        else:
            events = driver.finish(ExitInfo(exit_code, tail))
        out.send([e for e in events if not e.terminal])
        _log_counters(driver, out.publisher)
        terminal = driver.terminal
        assert terminal is not None  # finish() and fail() always leave one
        if isinstance(terminal, TurnComplete | SessionError) and terminal.exit_code is None:
            terminal = terminal.model_copy(update={"exit_code": exit_code})
        return Outcome(terminal, exit_code, tail)


def _log_counters(driver: StreamDriver, publisher: RedisStreamPublisher) -> None:
    """Lines the stream rules skipped or dropped are counted data: say how many, once per
    attempt (a warning when output was lost: an oversized line, a mapper error)."""
    counters = driver.counters
    if not (
        counters.oversized
        or counters.non_json
        or counters.mapper_errors
        or counters.dropped_after_terminal
    ):
        return
    lost = counters.oversized or counters.mapper_errors
    log.log(
        logging.WARNING if lost else logging.INFO,
        "stream.lines_dropped",
        extra={
            "stream": publisher.key,
            "stream_turn": publisher.turn,
            "counters": counters.as_dict(),
            "last_mapper_error": driver.last_mapper_error,
        },
    )
