"""Concurrency per API key, fleet-wide: two real worker processes share one key limited to N
turns at once. Never more than N harnesses run on it together, the waiting turns are served
fairly across producers and none starves, ``status`` shows a waiting turn's place, and a
slot held by a worker that died is given back by the reaper."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import demo_executable
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient
from worker.spend.slots import credential_hash

pytestmark = [pytest.mark.redis, pytest.mark.celery]

KEY_VALUE = "shared-demo-key-7f3a"
LIMIT = 2
SETTINGS = {
    "HARNESS_KEY_SLOTS": f"DEMO_TOKEN={LIMIT}",
    "HARNESS_SLOT_RETRY_S": "0.3",
    "HARNESS_REAP_INTERVAL_S": "1",
    "HARNESS_RESEND_AFTER_S": "2",
    "HARNESS_HEARTBEAT_TTL_S": "2",
}


@pytest.fixture
def env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    found = make_env(tmp_path_factory.mktemp("slots"), redis_url, **SETTINGS)
    yield found
    found.close()


@pytest.fixture
def workers(env: Env) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


def start(env: Env, workers: list[WorkerProcess]) -> WorkerProcess:
    worker = start_worker(env, extra_env={"DEMO_TOKEN": KEY_VALUE})
    workers.append(worker)
    return worker


def run(client: HarnessClient, script: str, producer: str) -> str:
    return client.start_run(
        "stdio-json",
        script,
        executable=demo_executable(),
        grants=["DEMO_TOKEN"],
        producer=producer,
    )


def span(client: HarnessClient, run_id: str) -> tuple[float, float]:
    """When the turn held its harness: its turn-started to its terminal (the slot is taken
    before the first and given back after the second)."""
    events = [e for e in client.events(run_id) if e.turn == 1]
    assert events[-1].type == "turn-complete", events[-1].data
    return events[0].ts, events[-1].ts


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_never_more_than_n_at_once_fair_across_producers_and_none_starved(
    env: Env, workers: list[WorkerProcess]
) -> None:
    start(env, workers)
    start(env, workers)
    client = env.client()
    script = "@sleep 1\n@complete ok"
    a_runs = [run(client, script, "producer-a") for _ in range(6)]
    b_runs = [run(client, script, "producer-b") for _ in range(2)]

    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not seen:
        for run_id in b_runs:
            wait = client.status(run_id)["waiting_for_slot"]
            if wait is not None:
                seen.append(wait)
        time.sleep(0.1)
    assert seen, "no turn was ever shown waiting for a slot"
    assert seen[0]["grant"] == "DEMO_TOKEN" and seen[0]["limit"] == LIMIT
    assert 1 <= seen[0]["place"] <= seen[0]["waiting"]

    for run_id in a_runs + b_runs:  # none starved
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    spans = {run_id: span(client, run_id) for run_id in a_runs + b_runs}
    assert most_at_once(list(spans.values())) == LIMIT  # at the limit, never above it
    order = [r for r, _ in sorted(spans.items(), key=lambda item: item[1][0])]
    b_places = sorted(order.index(r) for r in b_runs)
    # Fair: producer b asked after all six of a's turns, yet its turns alternate with a's
    # once a slot is free (round robin across producers): served third or fourth, then two
    # later. In order of asking (FIFO) they would be seventh and eighth.
    assert b_places[0] <= LIMIT + 1 and b_places[1] <= LIMIT + 3, order
    for run_id in a_runs + b_runs:
        assert client.status(run_id)["waiting_for_slot"] is None

    r = env.redis()
    keys = list(r.scan_iter(f"{env.prefix}:*"))
    assert r.smembers(env.keys.slots_index()) == {credential_hash(KEY_VALUE)}
    assert not any(KEY_VALUE in k for k in keys)  # a hash of the key, never the key
    for k in keys:
        if r.type(k) == "hash":
            assert KEY_VALUE not in str(r.hgetall(k))


def test_the_reaper_gives_back_a_slot_held_by_a_lost_worker(
    env: Env, workers: list[WorkerProcess]
) -> None:
    env.vars["HARNESS_KEY_SLOTS"] = "DEMO_TOKEN=1"
    first = start(env, workers)
    client = env.client()
    holder = run(client, "@sleep 60\n@complete never", "p")
    deadline = time.monotonic() + 20
    while client.status(holder)["status"] != "running" or not any(
        e.type == "session" for e in client.events(holder)
    ):
        assert time.monotonic() < deadline, "the first turn never started"
        time.sleep(0.1)
    start(env, workers)
    waiter = run(client, "@complete got the slot", "p")
    deadline = time.monotonic() + 10
    while client.status(waiter)["waiting_for_slot"] is None:
        assert time.monotonic() < deadline, "the second turn was not shown waiting"
        time.sleep(0.1)
    assert client.status(waiter)["waiting_for_slot"]["place"] == 1

    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    lost = client.wait(holder, 1, timeout=30)
    assert lost.data["reason"] == "worker-lost"
    assert client.wait(waiter, 1, timeout=30).type == "turn-complete"


def test_a_turn_cancelled_while_it_waits_holds_up_nobody(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.deps import Shutdown, TurnDeps
    from worker.options.spec import RunOptions, TurnPayload
    from worker.spend import slots
    from worker.store.records import RunStore

    monkeypatch.setenv("DEMO_TOKEN", KEY_VALUE)
    settings = env.settings(key_slots="DEMO_TOKEN=1")
    r = env.redis()
    deps = TurnDeps(
        settings=settings,
        redis=r,  # type: ignore[arg-type]
        keys=env.keys,
        store=RunStore(r, env.keys, settings.retention_s),  # type: ignore[arg-type]
        sandbox_for=lambda backend: None,  # type: ignore[arg-type,return-value]
        worker_id="test:1",
        shutdown=Shutdown(0),
    )
    sent: list[tuple[str, float]] = []

    def requeue(payload: dict[str, Any], queue: str, countdown: float) -> None:
        sent.append((payload["run_id"], countdown))

    options = RunOptions(harness="stdio-json", grants=("DEMO_TOKEN",), producer="p")
    holder, early, late = (TurnPayload(run_id="r" + c * 24, turn=1, input="x") for c in "abc")
    for payload in (holder, early, late):
        deps.store.create(payload.run_id, options, queue="q", sandbox="local")
    hold = slots.take(deps, holder, options, requeue)
    assert hold is not None and hold.held
    assert slots.take(deps, early, options, requeue) is None  # waits: place 1
    assert slots.take(deps, late, options, requeue) is None  # waits: place 2
    assert deps.store.record(late.run_id).slot_wait["place"] == 2  # type: ignore[index]
    assert [run_id for run_id, _ in sent] == [early.run_id, late.run_id]

    r.set(env.keys.turn_started(early.run_id, 1), "client-cancel")  # cancelled while waiting
    assert slots.take(deps, early, options, requeue) is slots.NO_HOLD  # its copy comes back
    hold.release()
    got = slots.take(deps, late, options, requeue)
    assert got is not None and got.held  # the cancelled turn is no longer ahead of it
    got.release()


def test_a_tenant_capped_below_the_limit_holds_no_more_and_leaves_the_rest_to_others(
    env: Env, workers: list[WorkerProcess]
) -> None:
    """``key_slots`` as a tenant's policy gives it (worker.api.tenants.apply_policy): acme's
    three turns run one at a time, beta's two take the other slot though they asked later."""
    start(env, workers)
    start(env, workers)
    client = env.client()
    script = "@sleep 1\n@complete ok"
    capped = [
        client.start_run(
            "stdio-json",
            script,
            executable=demo_executable(),
            grants=["DEMO_TOKEN"],
            producer="acme",
            key_slots={"DEMO_TOKEN": 1},
        )
        for _ in range(3)
    ]
    others = [run(client, script, "beta") for _ in range(2)]
    for run_id in capped + others:
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    acme = [span(client, run_id) for run_id in capped]
    beta = [span(client, run_id) for run_id in others]
    assert most_at_once(acme) == 1  # its cap, though a second slot was free
    assert most_at_once(acme + beta) == LIMIT
    # beta's turns ran beside acme's first two, not after all three
    assert max(end for _, end in beta) < max(start for start, _ in acme)
