"""A turn's owner holds it for the whole claim, and a turn ends once, whoever races to end it
(a turn held by one worker at a time): real Redis, a real worker process, the local sandbox."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.events import TERMINAL_TYPES
from config import load_settings
from sandbox.base import Placement, RunSpec
from sandbox.local import LocalSandbox
from tests.gitserver import GitServer, git_server
from tests.helpers import assert_one_terminal
from tests.integration.conftest import DEMO, Env, start_worker
from tests.integration.in_process import turn_deps
from worker.client import HarnessClient
from worker.fleet.lifecycle import ReapReport, close_lost_turns
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.turn.execute import TurnDeps, execute_turn
from worker.turn.life import HEARTBEATS

pytestmark = [pytest.mark.redis]


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[GitServer]:
    with git_server(tmp_path / "repos") as server:
        server.create("slow.git", {"README.md": "slow\n"})
        yield server


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.long
def test_a_clone_slower_than_the_heartbeat_and_a_reap_pass_ends_its_turn_once_complete(
    shared_env: Env, slow_server: GitServer
) -> None:
    settings = load_settings()  # the defaults a user runs with
    delay = slow_server.delay_s = settings.heartbeat_ttl_s + settings.reap_interval_s + 5
    shared_env.vars.update(HARNESS_REPO_SCHEMES="http", HARNESS_REPO_HOSTS="127.0.0.1")
    worker = start_worker(shared_env)
    client = shared_env.client()
    try:
        run_id = client.start_run(
            "stdio-json",
            "@complete seeded",
            executable=DEMO,
            repo=slow_server.url("slow.git"),
        )
        terminal = client.wait(run_id, 1, timeout=delay + 120)
        events = [e.as_dict() for e in client.events(run_id) if e.turn == 1]
        assert_one_terminal(events, 1)
        assert terminal.type == "turn-complete", terminal.data
        assert client.status(run_id)["seed"].startswith(slow_server.url("slow.git"))
        log = worker.logs()
        assert "turn.worker_lost" not in log
        client.end(run_id, timeout=30)
    finally:
        worker.stop()


@pytest.fixture
def race_world(tmp_path: Path, redis_url: str) -> Iterator[tuple[TurnDeps, HarnessClient]]:
    with turn_deps(tmp_path, redis_url, "race") as (deps, client, _):
        yield deps, client


def test_a_cancel_racing_a_claim_leaves_one_terminal_the_record_agrees_with(
    race_world: tuple[TurnDeps, HarnessClient], tmp_path: Path
) -> None:
    deps, client = race_world
    outcomes: dict[str, int] = {}
    for i in range(40):
        run_id = new_run_id()
        options = RunOptions(harness="stdio-json", executable=str(tmp_path / "harness-demo"))
        deps.store.create(run_id, options, queue="q", sandbox="local")
        payload = TurnPayload(run_id=run_id, turn=1, input="@complete done")
        go = threading.Barrier(2)

        def work(payload: TurnPayload = payload, go: threading.Barrier = go, i: int = i) -> None:
            go.wait()
            if i % 3 == 1:
                time.sleep(0.002 * (i % 5))
            execute_turn(deps, payload, delivery=f"d{i}")

        def cancel(run_id: str = run_id, go: threading.Barrier = go, i: int = i) -> None:
            go.wait()
            if i % 3 == 2:  # later and later: before the claim, during the turn, after it
                time.sleep(0.01 * i)
            client.cancel(run_id)

        threads = [threading.Thread(target=work), threading.Thread(target=cancel)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        entries = deps.redis.xrange(deps.keys.events(run_id))
        events = [
            {"id": entry_id, "type": f["type"], "data": json.loads(f["data"])}
            for entry_id, f in entries
        ]
        terminal = assert_one_terminal(events, 1)
        assert sum(e["type"] in TERMINAL_TYPES for e in events) == 1
        record = client.status(run_id)
        assert record["status"] == "idle", (i, record["status"], events)
        if terminal["type"] == "session-error":
            reason = terminal["data"]["reason"]
            assert reason == "cancelled", (i, terminal)
            assert record["last_error"].startswith(f"{reason}: "), (i, record["last_error"])
        else:
            assert record["last_error"] is None, (i, record["last_error"])
        outcomes[terminal["type"]] = outcomes.get(terminal["type"], 0) + 1
        # A second delivery of the same turn, after the race, runs nothing and ends nothing.
        assert execute_turn(deps, payload, delivery=f"again{i}") == "duplicate"
        assert len(deps.redis.xrange(deps.keys.events(run_id))) == len(entries)
    assert sum(outcomes.values()) == 40
    print("outcomes", outcomes)


class _HeldPrepare(LocalSandbox):
    """The local sandbox, whose next ``prepare`` waits until released: a turn held between
    its claim and its harness (as a Redis outage, a slow clone or a slow daemon holds one)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold_next = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()

    def prepare(self, spec: RunSpec) -> Placement:
        placement = super().prepare(spec)
        if self.hold_next.is_set():
            self.hold_next.clear()
            self.holding.set()
            self.release.wait(60)
        return placement


def _running(deps: TurnDeps, payload: TurnPayload) -> tuple[threading.Thread, dict[str, str]]:
    """The turn run on a thread of its own, once its harness has said something; the
    thread and, once it is over, the turn's outcome label (``outcome["label"]``)."""
    outcome: dict[str, str] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(label=execute_turn(deps, payload, delivery="run"))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        e["type"] == "assistant-text" for e in _texts(deps, payload.run_id, payload.turn)
    ):
        time.sleep(0.05)
    return thread, outcome


def _texts(deps: TurnDeps, run_id: str, turn: int) -> list[dict[str, object]]:
    return [
        {"id": entry_id, "type": f["type"], "data": json.loads(f["data"])}
        for entry_id, f in deps.redis.xrange(deps.keys.events(run_id), str(turn), str(turn))
    ]


@pytest.mark.parametrize("lapse", ["a-beat-finds-it-gone", "the-start-finds-it-gone"])
def test_a_turn_whose_hold_lapsed_before_its_harness_started_never_starts_it(
    race_world: tuple[TurnDeps, HarnessClient],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lapse: str,
) -> None:
    """Turn 2 is claimed, then held before its harness starts until its hold lapses; a reaper
    ends it ``worker-lost`` and the run goes on to turn 3. When turn 2 wakes, its harness must
    not start: it would kill turn 3's harness as a stray of an earlier turn (seen once in the
    CI soak as a turn ended ``exit``)."""
    world, _ = race_world
    sandbox = _HeldPrepare(tmp_path / "held")
    settings = world.settings.model_copy(update={"heartbeat_ttl_s": 2})
    deps = dataclasses.replace(world, settings=settings, sandbox_for=lambda backend: sandbox)
    run_id = new_run_id()
    options = RunOptions(harness="stdio-json", executable=str(tmp_path / "harness-demo"))
    deps.store.create(run_id, options, queue="q", sandbox="local")
    first = TurnPayload(run_id=run_id, turn=1, input="@complete one")
    assert execute_turn(deps, first, delivery="d1") == "completed"

    assert deps.store.begin_turn(run_id) == 2
    sandbox.hold_next.set()
    second = TurnPayload(run_id=run_id, turn=2, input="@text late\n@complete late")
    held = threading.Thread(target=execute_turn, args=(deps, second), kwargs={"delivery": "d2"})
    held.start()
    assert sandbox.holding.wait(30)
    owner = deps.keys.turn_owner(run_id, 2)
    slot = (deps.keys.prefix, run_id, 2)
    # Redis unreachable for the heartbeat thread alone cannot be made for real here: its beats
    # are switched off until the key has expired (the claim set it for 2 s) and a reaper pass
    # (another worker's) has ended the turn.
    real_beat = HEARTBEATS.beat
    monkeypatch.setattr(HEARTBEATS, "beat", lambda held: None)
    deadline = time.monotonic() + 10
    while deps.redis.exists(owner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not deps.redis.exists(owner)
    report = ReapReport()
    close_lost_turns(deps, report)
    assert report.lost_turns == [f"{run_id}/2"]
    if lapse == "a-beat-finds-it-gone":
        monkeypatch.setattr(HEARTBEATS, "beat", real_beat)
        deadline = time.monotonic() + 10
        while not HEARTBEATS.lost(slot) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert HEARTBEATS.lost(slot)  # the turn has ended: its hold cannot be taken again
        assert deps.redis.get(owner) is None
    else:
        assert not HEARTBEATS.lost(slot)  # nothing told the turn: its start must find out

    assert deps.store.begin_turn(run_id) == 3
    third = TurnPayload(run_id=run_id, turn=3, input="@text started\n@sleep 2\n@complete three")
    running, outcome = _running(deps, third)
    sandbox.release.set()  # turn 2 wakes while turn 3's harness runs
    held.join(60)
    running.join(60)

    second_events = _texts(deps, run_id, 2)
    terminal = assert_one_terminal(second_events, 2)
    assert terminal["data"]["reason"] == "worker-lost", terminal
    assert not [e for e in second_events if e["type"] == "assistant-text"]
    third_events = _texts(deps, run_id, 3)
    assert outcome.get("label") == "completed", third_events
    assert assert_one_terminal(third_events, 3)["type"] == "turn-complete"


@pytest.mark.parametrize("reaped", [True, False])
def test_a_hold_that_lapses_mid_turn_is_taken_again_unless_the_turn_was_ended(
    race_world: tuple[TurnDeps, HarnessClient],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reaped: bool,
) -> None:
    """A lapsed hold that no reaper acted on is taken again and the turn completes (a Redis
    blip costs nothing); once a reaper ended the turn, its harness is stopped at once (its
    work would be dropped, and the run's next turn would kill it)."""
    world, _ = race_world
    deps = dataclasses.replace(
        world, settings=world.settings.model_copy(update={"heartbeat_ttl_s": 2})
    )
    run_id = new_run_id()
    options = RunOptions(harness="stdio-json", executable=str(tmp_path / "harness-demo"))
    deps.store.create(run_id, options, queue="q", sandbox="local")
    sleep = 30 if reaped else 4
    payload = TurnPayload(
        run_id=run_id, turn=1, input=f"@text started\n@sleep {sleep}\n@complete done"
    )
    real_beat = HEARTBEATS.beat
    running, outcome = _running(deps, payload)
    owner = deps.keys.turn_owner(run_id, 1)
    monkeypatch.setattr(HEARTBEATS, "beat", lambda held: None)  # Redis away for the beats
    deps.redis.delete(owner)  # its hold lapses
    if reaped:
        report = ReapReport()
        close_lost_turns(deps, report)
        assert report.lost_turns == [f"{run_id}/1"]
    started = time.monotonic()
    monkeypatch.setattr(HEARTBEATS, "beat", real_beat)  # Redis back
    running.join(30)
    assert not running.is_alive()
    terminal = assert_one_terminal(_texts(deps, run_id, 1), 1)
    if reaped:
        assert time.monotonic() - started < 10  # a beat (2/3 s) and a poll, not the 30 s sleep
        assert terminal["data"]["reason"] == "worker-lost", terminal
        assert outcome["label"] == "failed:worker-lost"
    else:
        assert terminal["type"] == "turn-complete", terminal
        assert deps.redis.get(owner) is None  # taken again, then released with the turn
