"""``--posture ask`` live: the real CLIs against the fake model server, each permission
request answered through Redis (``worker.permissions.requests``) as a producer answers it.

The fake model's ``edit`` scenario makes one shell call that writes ``agent.txt`` into the
workspace: approved, the file exists; denied, it does not, and the turn still ends with
exactly one terminal event.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import pytest

import adapters
from adapters.events import Event
from adapters.protocol import McpServer, TurnRequest
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
from tests.fakemodel import FakeModelServer
from tests.helpers import assert_one_terminal
from worker.observe.masking import Masker
from worker.permissions import requests as permissions
from worker.store.keys import Keys
from worker.turn import attempt

ASKING = [h for h in adapters.HARNESS_IDS if adapters.get(h).CAPABILITIES.permission_ask]
LIVE = [h for h in ASKING if h != "stdio-json"]
#: The model each CLI is asked for (opencode and pi need one to use a base URL).
MODELS = {
    "codex": "gpt-5.5",
    "gemini": "gemini-2.5-flash",
    "opencode": "fake-model",
    "pi": "fake-model",
}


@dataclasses.dataclass
class AskedTurn:
    events: list[Event]
    workspace: Path
    answered: list[dict[str, Any]]
    placement: Placement | None = None
    state: Any = None

    def of_type(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.type == kind]


RunAsked = Callable[..., AskedTurn]


@pytest.fixture
def run_asked(
    request: pytest.FixtureRequest,
    fake_model: FakeModelServer,
    live_sandbox: LocalSandbox,
    live_placement: Callable[[], Placement],
) -> RunAsked:
    """One ``--posture ask`` turn through the worker's read loop and gate; ``decide`` is
    called with each pending request and returns ``(allow, always)`` or None (no answer)."""

    def run(
        harness_id: str,
        text: str,
        decide: Callable[[dict[str, Any]], tuple[bool, bool] | None],
        *,
        timeout_s: float = 60.0,
        permission_timeout_s: float = 60.0,
        placement: Placement | None = None,
        resume_session: str | None = None,
        mcp_servers: tuple[McpServer, ...] = (),
        secrets: dict[str, str] | None = None,
        model: str | None = None,
    ) -> AskedTurn:
        adapter = adapters.get(harness_id)
        placement = placement or live_placement()
        granted = {**DEFAULT_SECRETS.get(harness_id, {}), **(secrets or {})}
        turn_request = TurnRequest(
            input=text,
            posture="ask",
            model=model or MODELS.get(harness_id),
            turn=2 if resume_session else 1,
            resume_session=resume_session,
            workspace=placement.workspace,
            home=placement.home,
            base_url=base_url_for(harness_id, fake_model),
            granted_env=frozenset(granted),
            mcp_servers=mcp_servers,
        )
        command = adapter.build_command(turn_request)
        argv = _resolve(command.argv, lambda: request.getfixturevalue("clis"))
        spec = ExecSpec(
            argv=argv,
            stdin=command.stdin,
            env=dict(command.env),
            files=dict(command.files),
            cwd=command.cwd,
            keep_stdin=command.keep_stdin,
        )
        out = _RecordingPublishing(placement.run_id)
        client: Any = out.publisher._redis
        keys = Keys("conformance")
        gate = permissions.Gate(
            client,
            keys,
            placement.run_id,
            1,
            timeout_s=permission_timeout_s,
            masker=Masker(),
        )
        answered: list[dict[str, Any]] = []
        stop = threading.Event()

        def answerer() -> None:
            seen: set[str] = set()
            while not stop.is_set():
                for pending in permissions.pending(client, keys, placement.run_id):
                    if pending["request_id"] in seen:
                        continue
                    seen.add(pending["request_id"])
                    verdict = decide(pending)
                    if verdict is not None:
                        answered.append(
                            permissions.answer(
                                client,
                                keys,
                                placement.run_id,
                                pending["request_id"],
                                allow=verdict[0],
                                always=verdict[1],
                                by="live-test",
                                message=None if verdict[0] else "denied by the live test",
                            )
                        )
                time.sleep(0.05)

        thread = threading.Thread(target=answerer, daemon=True)
        thread.start()
        driver = StreamDriver(adapter, turn_request)
        limits = attempt.Limits(
            deadline=time.monotonic() + timeout_s,
            idle_s=timeout_s,
            exit_grace_s=EXIT_GRACE_S,
            kill_grace_s=1.0,
        )
        process = live_sandbox.start(placement, spec, granted)
        gate.attach(adapter, driver.state, process)
        try:
            outcome = attempt.drive(process, driver, out, limits, lambda: None, gate)
        finally:
            stop.set()
            thread.join(5)
        events = [*out.events, outcome.terminal]
        workspace = Path(placement.workspace)
        return AskedTurn(events, workspace, answered, placement, driver.state)

    return run


@pytest.fixture(autouse=True)
def _lua_in_fakeredis() -> None:
    # The gate's answer script runs in fakeredis's Lua (lupa) here, as in Redis in a worker.
    fakeredis.FakeRedis(decode_responses=True).register_script("return 1")()


def _request_and_decision(turn: AskedTurn) -> tuple[Event, Event]:
    [asked] = turn.of_type("permission-request")
    [decided] = turn.of_type("permission-decision")
    return asked, decided


@pytest.mark.parametrize("harness_id", LIVE)
def test_approved_request_runs_the_command(run_asked: RunAsked, harness_id: str) -> None:
    turn = run_asked(harness_id, f"[scenario:edit] {uuid.uuid4().hex[:6]}", lambda r: (True, False))
    assert_one_terminal(turn.events)
    assert turn.events[-1].type == "turn-complete", turn.events[-1]
    asked, decided = _request_and_decision(turn)
    assert asked.deadline is not None and "agent.txt" in (asked.input or "")
    assert decided.decision == "allow" and decided.by == "live-test"
    assert (turn.workspace / "agent.txt").exists()


@pytest.mark.parametrize("harness_id", LIVE)
def test_denied_request_does_not_run_and_the_turn_ends_once(
    run_asked: RunAsked, harness_id: str
) -> None:
    turn = run_asked(
        harness_id, f"[scenario:edit] {uuid.uuid4().hex[:6]}", lambda r: (False, False)
    )
    assert_one_terminal(turn.events)
    _, decided = _request_and_decision(turn)
    assert decided.decision == "deny" and decided.message == "denied by the live test"
    assert not (turn.workspace / "agent.txt").exists()


@pytest.mark.parametrize("harness_id", LIVE)
def test_unanswered_request_is_denied_at_its_deadline(run_asked: RunAsked, harness_id: str) -> None:
    turn = run_asked(
        harness_id,
        f"[scenario:edit] {uuid.uuid4().hex[:6]}",
        lambda r: None,
        permission_timeout_s=3,
    )
    assert_one_terminal(turn.events)
    _, decided = _request_and_decision(turn)
    assert decided.decision == "deny" and decided.by == "worker:deadline"
    assert not (turn.workspace / "agent.txt").exists()
