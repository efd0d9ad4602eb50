"""Redis that loses its data mid-run (a restart without persistence, a FLUSHALL), as a client
sees it: every follower (``harness run --follow``, ``harness events --follow``,
``HarnessClient.wait``) says the run is lost and stops within seconds instead of waiting
forever, and no key of ours is left without an expiry. Also ``harness doctor``'s warning
about a Redis that keeps nothing on disk. A private redis-server per test (bench/private_redis.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.private_redis import PrivateRedis
from config import load_settings
from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.integration.api_server import start_api
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from tests.integration.test_api_sse import parse
from worker.cli.doctor import Check, collect, redis_config_checks
from worker.errors import StreamLost
from worker.store import stream_end

# Mostly waiting on real time (faults, drains, handlers asleep): in the parallel phase.
pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.long]

SLOW_TURN = "@text begun\n@sleep 2\n@stream 12 0.25\n@complete done"
"""A turn that streams for about 5 s after its first event: time to lose Redis under it."""
LOST_WITHIN_S = 8.0
"""A follower must have said the run is lost this long after the loss (it looks every
second when nothing comes)."""
FLEET_REGISTRY = ":hosts"
"""Every host queue a worker ever announced (the reaper's fan-out): one small hash per
deployment, kept while the deployment lives, not a key of a run."""


@pytest.fixture
def volatile(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server that keeps nothing on disk (``appendonly no``, ``save ""``)."""
    server = PrivateRedis(tmp_path, append_only=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fault_env(tmp_path: Path, volatile: PrivateRedis) -> Iterator[Env]:
    env = make_env(tmp_path, volatile.url)
    yield env
    for client in env.clients:
        client.close()


@pytest.fixture
def worker(fault_env: Env) -> Iterator[WorkerProcess]:
    started = start_worker(fault_env)
    yield started
    started.stop()


def _cli(env: Env, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env.vars},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _begun(env: Env, run_id: str) -> None:
    """Wait until the run's first turn has streamed its first text."""
    redis = env.redis()
    wait_for(lambda: len(redis.xrange(env.keys.events(run_id))) >= 2, timeout=30)


def _ends_lost(proc: subprocess.Popen[str], lost_at: float) -> str:
    """The follower's stderr once it has exited 1 saying the run is lost, in time."""
    try:
        _, err = proc.communicate(timeout=LOST_WITHIN_S + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the follower still waits for a lost run:\n{err}")
    assert time.monotonic() - lost_at < LOST_WITHIN_S, err
    assert proc.returncode == 1, err
    assert "is lost" in err, err
    return err


def test_run_follow_says_the_run_is_lost_after_a_flushall(
    fault_env: Env, worker: WorkerProcess
) -> None:
    proc = _cli(fault_env, "run", "stdio-json", SLOW_TURN, "--executable", DEMO, "--follow")
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    _begun(fault_env, run_id)
    fault_env.redis().flushall()
    err = _ends_lost(proc, time.monotonic())
    assert f"run {run_id} is lost" in err


def test_events_follow_says_the_run_is_lost_after_a_restart_without_persistence(
    fault_env: Env, worker: WorkerProcess, volatile: PrivateRedis
) -> None:
    run_id = fault_env.client().start_run("stdio-json", SLOW_TURN, executable=DEMO)
    _begun(fault_env, run_id)
    proc = _cli(fault_env, "events", run_id, "--follow", "--json")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith('{"id": "1-0"')  # it follows the run
    time.sleep(0.5)
    volatile.restart(down_for_s=0.5)
    _ends_lost(proc, time.monotonic())  # it rides out the outage, then finds the run gone


def test_wait_raises_stream_lost_after_a_flushall(fault_env: Env, worker: WorkerProcess) -> None:
    client = fault_env.client()
    run_id = client.start_run("stdio-json", SLOW_TURN, executable=DEMO)
    _begun(fault_env, run_id)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.wait, run_id, 1, LOST_WITHIN_S + 20)
        time.sleep(1.0)  # the wait has read what there is and waits for the terminal
        fault_env.redis().flushall()
        lost_at = time.monotonic()
        with pytest.raises(StreamLost) as raised:
            waiting.result()
    assert time.monotonic() - lost_at < LOST_WITHIN_S
    assert raised.value.run_id == run_id
    with pytest.raises(StreamLost):  # the follow of a run, and of a turn, the same
        list(client.follow_run(run_id, after="1-1"))
    with pytest.raises(StreamLost):
        list(client.follow(run_id, 1, after="1-1"))


def test_an_sse_stream_says_the_run_is_lost_after_a_flushall(
    fault_env: Env, worker: WorkerProcess
) -> None:
    """``GET .../events/stream`` of a run whose data Redis lost ends with a ``stream-lost``
    event (no id: not an entry of the run) instead of keep-alives forever, or a quiet close a
    client cannot tell from the run's end."""
    api = start_api(fault_env)
    try:
        api.add_tenant("acme")
        with api.client("acme") as http:
            created = http.post(
                "/v1/runs", json={"harness": "stdio-json", "input": SLOW_TURN, "executable": DEMO}
            )
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            _begun(fault_env, run_id)
            text, lost_at = "", 0.0
            with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
                assert response.status_code == 200
                for chunk in response.iter_text():
                    text += chunk
                    if not lost_at and "id: 1-1" in text:
                        fault_env.redis().flushall()
                        lost_at = time.monotonic()
        assert lost_at and time.monotonic() - lost_at < LOST_WITHIN_S
        messages = list(parse(text))
        assert messages[-1].get("event") == "stream-lost", messages[-3:]
        assert "id" not in messages[-1]
        assert "gone from Redis" in json.loads(messages[-1]["data"])["reason"]
    finally:
        api.stop()


def test_no_key_is_left_without_an_expiry_after_a_flushall(
    fault_env: Env, worker: WorkerProcess
) -> None:
    redis = fault_env.redis()
    run_id = fault_env.client().start_run("stdio-json", SLOW_TURN, executable=DEMO)
    _begun(fault_env, run_id)
    redis.flushall()  # the worker goes on streaming the turn into a Redis that forgot the run
    wait_for(lambda: "turn.finished" in worker.logs(), timeout=60)
    time.sleep(0.5)
    lasting = [
        key
        for key in redis.scan_iter(f"{fault_env.prefix}*")
        if redis.ttl(key) == -1 and key != f"{fault_env.prefix}{FLEET_REGISTRY}"
    ]
    assert lasting == []
    assert not redis.exists(fault_env.keys.events(run_id))


def _checks(url: str) -> dict[str, Check]:
    settings = load_settings(redis_url=url, broker_url=url)
    return {check.name: check for check in redis_config_checks(settings)}


def test_doctor_warns_about_a_redis_without_persistence(volatile: PrivateRedis) -> None:
    check = _checks(volatile.url)["redis persistence"]
    assert check.level == "warn"
    assert 'appendonly no, save ""' in check.detail
    assert "--appendonly yes" in check.fix


@pytest.mark.parametrize(
    ("config", "level", "said"),
    [
        (("--appendonly", "yes"), "ok", "appendonly yes"),
        (("--appendonly", "no", "--save", "60 1"), "ok", "RDB snapshots only"),
        (("--rename-command", "CONFIG", ""), "ok", "refused CONFIG"),
    ],
    ids=["append-only", "snapshots", "config-refused"],
)
def test_doctor_finds_persistence_or_notes_it_cannot_tell(
    tmp_path: Path, config: tuple[str, ...], level: str, said: str
) -> None:
    server = PrivateRedis(tmp_path, append_only=False, config=config)
    server.start()
    try:
        checks = _checks(server.url)
    finally:
        server.stop()
    assert checks["redis persistence"].level == level
    assert said in checks["redis persistence"].detail


def test_doctor_warns_about_a_redis_that_may_evict_runs(tmp_path: Path) -> None:
    server = PrivateRedis(
        tmp_path, config=("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
    )
    server.start()
    try:
        check = _checks(server.url)["redis eviction"]
    finally:
        server.stop()
    assert check.level == "warn"
    assert "noeviction" in check.fix


def test_doctor_runs_the_redis_checks(volatile: PrivateRedis) -> None:
    settings = load_settings(redis_url=volatile.url, broker_url=volatile.url, sandbox="local")
    names = [check.name for check in collect(settings)]
    assert names[:4] == ["redis", "broker", "redis persistence", "redis eviction"]


@pytest.mark.parametrize(
    ("status", "newest", "lost"),
    [
        ("running", [], False),
        ("ended", [("1-3", {"type": "turn-complete"})], False),
        (None, [], True),  # record and stream gone: a Redis that lost its data
        (None, [("1-3", {"type": "assistant-text"})], True),  # the record alone: evicted
        (None, [("1-3", {"type": "session-error"})], False),  # expiring together, ended
    ],
    ids=["live", "ended", "all-gone", "record-gone-mid-turn", "record-gone-after-terminal"],
)
def test_a_run_is_lost_when_its_record_is_gone_and_its_stream_has_no_end(
    status: str | None, newest: list[Any], lost: bool
) -> None:
    assert stream_end.lost(status, newest) is lost
