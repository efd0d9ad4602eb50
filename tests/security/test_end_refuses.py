"""A run asked to end refuses every later turn from the moment ``end`` returns, with or without
waiting for its teardown: ``DELETE /v1/runs/{id}`` of a real ``harness api`` process, then a
turn sent right after, is 409 (never 202, turn N+1); the client's ``end(wait=False)`` then
``submit_turn`` is RunEnded, and ``harness turn`` exits 2. Each with a live worker (the race
with its teardown) and with no worker on the run's host (the teardown never comes: the run
must still refuse). Local sandbox, real Redis, real worker processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.client import HarnessClient
from worker.errors import RunEnded

pytestmark = [pytest.mark.redis, pytest.mark.celery]

RUN = {"harness": "stdio-json", "executable": DEMO}


@pytest.fixture(scope="module")
def end_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    env = make_env(tmp_path_factory.mktemp("end-refuses"), redis_url)
    yield env
    for client in env.clients:
        client.close()


@pytest.fixture(scope="module")
def api(end_env: Env) -> Iterator[ApiProcess]:
    server = start_api(end_env)
    server.add_tenant("acme")
    yield server
    server.stop()


@pytest.fixture
def worker(end_env: Env) -> Iterator[WorkerProcess]:
    started = start_worker(end_env)
    yield started
    started.stop()


def idle_run(http: httpx.Client, client: HarnessClient, text: str = "hello") -> str:
    """A run made through the API whose first turn has completed."""
    response = http.post("/v1/runs", json={**RUN, "input": text})
    assert response.status_code == 201, response.text
    run_id: str = response.json()["run_id"]
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    return run_id


def refused_over_http(http: httpx.Client, run_id: str) -> dict[str, Any]:
    response = http.post(f"/v1/runs/{run_id}/turns", json={"input": "one more"})
    assert response.status_code == 409, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_a_turn_sent_right_after_delete_is_409_with_a_live_worker(
    end_env: Env, api: ApiProcess, worker: WorkerProcess
) -> None:
    client = end_env.client()
    with api.client("acme") as http:
        for _ in range(5):
            run_id = idle_run(http, client)
            ended = http.delete(f"/v1/runs/{run_id}")
            assert ended.status_code == 200, ended.text
            assert refused_over_http(http, run_id)["type"] == "run_ended"
            assert client.status(run_id)["turns"] == 1


def test_a_turn_sent_after_delete_is_409_while_no_worker_tears_the_run_down(
    end_env: Env, api: ApiProcess
) -> None:
    client = end_env.client()
    worker = start_worker(end_env)
    with api.client("acme") as http:
        try:
            run_id = idle_run(http, client)
        finally:
            worker.stop()
        ended = http.delete(f"/v1/runs/{run_id}")
        assert ended.status_code == 200, ended.text
        time.sleep(0.5)  # whatever comes after the answer: nothing tears the run down now
        error = refused_over_http(http, run_id)
        assert error["type"] == "run_ended" and "ending" in error["message"]
        record = client.status(run_id)
        assert record["status"] == "idle" and record["end_requested_at"] is not None
        assert record["turns"] == 1
        # Idempotent: ending it again answers, and it still refuses.
        assert http.delete(f"/v1/runs/{run_id}").status_code == 200
        refused_over_http(http, run_id)


def test_client_end_without_waiting_then_submit_is_run_ended(
    end_env: Env, worker: WorkerProcess
) -> None:
    client = end_env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    client.end(run_id, wait=False)
    with pytest.raises(RunEnded):
        client.submit_turn(run_id, "one more")

    # A turn in flight when end is asked: it is cancelled, and the next is refused as ended
    # (not as busy).
    busy = client.start_run("stdio-json", "hello", executable=DEMO)
    assert client.wait(busy, 1, timeout=60).type == "turn-complete"
    assert client.submit_turn(busy, "@sleep 30\n@complete late") == 2
    client.end(busy, wait=False)
    with pytest.raises(RunEnded):
        client.submit_turn(busy, "one more")
    last = client.wait(busy, 2, timeout=60)
    assert last.type == "session-error" and last.data["reason"] == "cancelled"
    deadline = time.monotonic() + 30
    while client.status(busy)["status"] != "ended":
        assert time.monotonic() < deadline, "the worker did not tear the run down"
        time.sleep(0.1)
    assert client.status(busy)["turns"] == 2


def test_harness_turn_after_end_without_waiting_exits_2(end_env: Env) -> None:
    client = end_env.client()
    worker = start_worker(end_env)
    try:
        run_id = client.start_run("stdio-json", "hello", executable=DEMO)
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    finally:
        worker.stop()
    client.end(run_id, wait=False)
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "turn", run_id, "one more"],
        cwd=ROOT,
        env={**os.environ, **end_env.vars},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "ending" in done.stderr and "no more turns" in done.stderr
