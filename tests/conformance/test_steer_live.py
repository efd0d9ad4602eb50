"""``harness steer --mode steer`` live: a message written on the ask mode's own channel while
the turn's tool runs reaches the model in the turn's next request (docs/adapters.md,
"Steering"). The fake model's ``held`` scenario runs a shell command that waits for the
test: it steers, then lets the command finish; every permission request is allowed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import adapters
from adapters.asks import Decision
from adapters.events import SessionError
from adapters.protocol import TurnRequest
from adapters.stream import StreamDriver
from sandbox.base import ExecSpec, Placement
from sandbox.local import LocalSandbox
from tests.conformance.conftest import (
    DEFAULT_SECRETS,
    EXIT_GRACE_S,
    _RecordingPublishing,
    _resolve,
    base_url_for,
)
from tests.conformance.test_permissions_live import MODELS
from tests.fakemodel import FakeModelServer
from tests.fakemodel.scenarios import HELD_GO, HELD_READY
from tests.helpers import assert_one_terminal
from worker.turn import attempt

NATIVE = [
    h
    for h in adapters.HARNESS_IDS
    if h != "stdio-json" and adapters.get(h).CAPABILITIES.steering != "emulated"
]
SETTLE_S = 1.0
"""How long the written steer has to be read before the held command is let go (the CLI
reads its stdin while the command runs; none says it has the line before it uses it)."""


@pytest.mark.parametrize("harness_id", NATIVE)
def test_a_steer_reaches_the_next_model_request_of_the_running_turn(
    request: pytest.FixtureRequest,
    fake_model: FakeModelServer,
    live_sandbox: LocalSandbox,
    live_placement: Callable[[], Placement],
    harness_id: str,
) -> None:
    adapter = adapters.get(harness_id)
    placement = live_placement()
    granted = DEFAULT_SECRETS[harness_id]
    turn_request = TurnRequest(
        input=f"[scenario:held] {uuid.uuid4().hex[:6]}",
        posture="ask",
        model=MODELS.get(harness_id),
        workspace=placement.workspace,
        home=placement.home,
        base_url=base_url_for(harness_id, fake_model),
        granted_env=frozenset(granted),
    )
    command = adapter.build_command(turn_request)
    spec = ExecSpec(
        argv=_resolve(command.argv, lambda: request.getfixturevalue("clis")),
        stdin=command.stdin,
        env=dict(command.env),
        files=dict(command.files),
        cwd=command.cwd,
        keep_stdin=command.keep_stdin,
    )
    steer = f"STEER-{uuid.uuid4().hex[:8]} use the other file"
    workspace = Path(placement.workspace)
    driver = StreamDriver(adapter, turn_request)
    process = live_sandbox.start(placement, spec, granted)
    steered: list[bool] = []
    steered_at = 0.0

    def between_reads() -> SessionError | None:
        # The read loop's cancel check: permission requests allowed, the steer written once
        # the held command runs, the command let go once the CLI had time to read it.
        nonlocal steered_at
        state = driver.state
        while state.asks:
            adapter.answer(state, state.asks.pop(0), Decision(allow=True))
        if not steered and (workspace / HELD_READY).exists():
            steered.append(adapter.steer(state, steer))
            steered_at = time.monotonic()
        elif steered and time.monotonic() - steered_at >= SETTLE_S:
            (workspace / HELD_GO).touch()
        while state.outbox:
            process.write(state.outbox.pop(0))
        return None

    limits = attempt.Limits(
        deadline=time.monotonic() + 120,
        idle_s=120,
        exit_grace_s=EXIT_GRACE_S,
        kill_grace_s=1.0,
    )
    out = _RecordingPublishing(placement.run_id)
    seen = len(fake_model.requests)
    outcome = attempt.drive(process, driver, out, limits, between_reads)
    events = [*out.events, outcome.terminal]
    assert_one_terminal(events)
    assert steered == [True]
    assert outcome.terminal.type == "turn-complete", outcome.terminal
    calls = [r for r in fake_model.requests[seen:] if r.kind == "turn"]
    carrying = [i for i, call in enumerate(calls) if steer in call.body_text()]
    # The request that carries the held command's result is the first to carry the steer.
    assert carrying, [c.body_text()[-600:] for c in calls]
    first = calls[carrying[0]]
    assert "held-ran" in first.body_text()
    assert all(steer not in c.body_text() for c in calls[: carrying[0]])
