"""A turn's owner holds it for the whole claim, and a turn ends once, whoever races to end it
(issue 23, points 1 and 2): real Redis, a real worker process, the local sandbox."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from adapters.events import TERMINAL_TYPES
from config import load_settings
from sandbox.local import LocalSandbox
from tests.gitserver import GitServer, git_server
from tests.helpers import assert_one_terminal
from tests.integration.conftest import DEMO, Env, start_worker
from worker.client import HarnessClient
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.store.keys import Keys
from worker.store.records import RunStore
from worker.turn.execute import Shutdown, TurnDeps, execute_turn

pytestmark = [pytest.mark.redis]

DEMO_SCRIPT = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"


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
    prefix = "race" + os.urandom(4).hex()
    wrapper = tmp_path / "harness-demo"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO_SCRIPT}" "$@"\n')
    wrapper.chmod(0o755)
    settings = load_settings(
        redis_url=redis_url,
        sandbox="local",
        key_prefix=prefix,
        workspace_root=str(tmp_path),
        allowed_executables=("*",),
        snapshots=False,
        exit_grace_s=1.0,
        kill_grace_s=0.2,
    )
    client = HarnessClient(settings)
    sandbox = LocalSandbox(tmp_path / "local")
    deps = TurnDeps(
        settings=settings,
        redis=client.redis,
        keys=Keys(prefix),
        store=RunStore(client.redis, Keys(prefix), settings.retention_s),
        sandbox_for=lambda backend: sandbox,
        worker_id="race-host:1",
        shutdown=Shutdown(settings.shutdown_grace_s),
    )
    yield deps, client
    for found in sandbox.managed():
        sandbox.teardown(found.run_id)
    raw = redis.Redis.from_url(redis_url)
    for key in raw.scan_iter(f"{prefix}:*"):
        raw.delete(key)
    client.close()


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
