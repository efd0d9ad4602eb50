"""``Idempotency-Key`` on ``POST /v1/runs`` and ``POST /v1/runs/{id}/turns`` against a real
``harness api`` process (docs/api.md, "Idempotency"), and the client's and CLI's
``idempotency_key``: a retry gets the first answer and starts nothing; another request with
the key is 422; concurrent duplicates start one run; keys are per tenant."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.conftest import DEMO, Env
from worker.store import idempotency

pytestmark = [pytest.mark.redis, pytest.mark.celery]

RUN = {"harness": "stdio-json", "executable": DEMO}


def fresh_tenant(api: ApiProcess) -> str:  # noqa: F811
    name = f"t{uuid.uuid4().hex[:10]}"
    api.add_tenant(name)
    return name


def run_ids(http: httpx.Client) -> list[str]:
    listing = http.get("/v1/runs", params={"limit": 500})
    assert listing.status_code == 200, listing.text
    return [run["run_id"] for run in listing.json()["runs"]]


def create(
    http: httpx.Client, key: str | bytes, text: str = "hello", **extra: Any
) -> httpx.Response:
    return http.post(
        "/v1/runs", json={**RUN, "input": text, **extra}, headers={"Idempotency-Key": key}
    )


def wait_idle(http: httpx.Client, run_id: str, turn: int) -> None:
    """Until turn ``turn`` has its terminal event and the run is idle."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ended = any(
            e["id"].startswith(f"{turn}-") and e["type"] in ("turn-complete", "session-error")
            for e in http.get(f"/v1/runs/{run_id}/events").json()
        )
        if ended and http.get(f"/v1/runs/{run_id}").json()["status"] == "idle":
            return
        time.sleep(0.1)
    raise AssertionError(f"{run_id} did not end turn {turn}")


def test_a_retried_creation_returns_the_first_answer_and_starts_one_run(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client(fresh_tenant(api)) as http:
        key = str(uuid.uuid4())
        first = create(http, key)
        again = create(http, key)
        assert first.status_code == again.status_code == 201, (first.text, again.text)
        assert again.json() == first.json()
        assert run_ids(http) == [first.json()["run_id"]]
        other = create(http, str(uuid.uuid4()))  # a new key: a new run
        assert other.status_code == 201 and other.json()["run_id"] != first.json()["run_id"]


def test_the_same_key_with_another_body_is_refused(api: ApiProcess) -> None:  # noqa: F811
    with api.client(fresh_tenant(api)) as http:
        key = str(uuid.uuid4())
        assert create(http, key, "one").status_code == 201
        changed = create(http, key, "two")
        assert changed.status_code == 422, changed.text
        error = changed.json()["error"]
        assert error["type"] == "idempotency_mismatch"
        assert "another request" in error["message"]
        assert len(run_ids(http)) == 1


def test_concurrent_duplicates_start_one_run(api: ApiProcess) -> None:  # noqa: F811
    tenant = fresh_tenant(api)
    key = str(uuid.uuid4())

    def post(_: int) -> httpx.Response:
        with api.client(tenant) as http:
            return create(http, key, "together")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    created = [a for a in answers if a.status_code == 201]
    waiting = [a for a in answers if a.status_code != 201]
    assert created, [a.text for a in answers]
    assert {a.json()["run_id"] for a in created} == {created[0].json()["run_id"]}
    for answer in waiting:  # a duplicate that outwaited the first's answer
        assert answer.status_code == 409 and answer.json()["error"]["type"] == "in_progress"
        assert answer.headers["Retry-After"]
    with api.client(tenant) as http:
        assert run_ids(http) == [created[0].json()["run_id"]]


def test_keys_are_per_tenant(api: ApiProcess) -> None:  # noqa: F811
    key = str(uuid.uuid4())
    with api.client(fresh_tenant(api)) as one, api.client(fresh_tenant(api)) as two:
        mine, theirs = create(one, key), create(two, key)
        assert mine.status_code == theirs.status_code == 201
        assert mine.json()["run_id"] != theirs.json()["run_id"]
        assert run_ids(two) == [theirs.json()["run_id"]]


@pytest.mark.parametrize("key", ["has space", "x" * 256, "ключ".encode(), "a\tb", ""])
def test_a_key_out_of_bounds_is_refused(api: ApiProcess, key: str | bytes) -> None:  # noqa: F811
    with api.client(fresh_tenant(api)) as http:
        refused = create(http, key)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["path"].lower() == "header.idempotency-key"
        assert run_ids(http) == []


def test_a_failed_request_leaves_its_key_free(api: ApiProcess) -> None:  # noqa: F811
    with api.client(fresh_tenant(api)) as http:
        key = str(uuid.uuid4())
        refused = http.post(
            "/v1/runs",
            json={"harness": "no-such-harness", "input": "x"},
            headers={"Idempotency-Key": key},
        )
        assert refused.status_code == 400, refused.text
        assert create(http, key).status_code == 201  # nothing was started: the key is free
        assert len(run_ids(http)) == 1


def test_a_retried_turn_returns_the_first_turn(api: ApiProcess) -> None:  # noqa: F811
    with api.client(fresh_tenant(api)) as http:
        run_id = create(http, str(uuid.uuid4())).json()["run_id"]
        wait_idle(http, run_id, 1)
        key = str(uuid.uuid4())
        path = f"/v1/runs/{run_id}/turns"
        first = http.post(path, json={"input": "again"}, headers={"Idempotency-Key": key})
        again = http.post(path, json={"input": "again"}, headers={"Idempotency-Key": key})
        assert first.status_code == again.status_code == 202, (first.text, again.text)
        assert first.json() == again.json() == {"run_id": run_id, "turn": 2}
        wait_idle(http, run_id, 2)
        late = http.post(path, json={"input": "again"}, headers={"Idempotency-Key": key})
        assert late.status_code == 202 and late.json()["turn"] == 2  # not a third turn
        other = http.post(path, json={"input": "other"}, headers={"Idempotency-Key": key})
        assert other.status_code == 422
        assert other.json()["error"]["type"] == "idempotency_mismatch"
        turns = [
            e for e in http.get(f"/v1/runs/{run_id}/events").json() if e["type"] == "turn-started"
        ]
        assert len(turns) == 2


def test_the_client_and_the_cli_take_a_key(api_env: Env) -> None:  # noqa: F811
    client = api_env.client()
    key = str(uuid.uuid4())
    first = client.start_run("stdio-json", "hi", executable=DEMO, idempotency_key=key)
    assert client.start_run("stdio-json", "hi", executable=DEMO, idempotency_key=key) == first

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "worker.cli", *args],
            cwd=ROOT,
            env={**os.environ, **api_env.vars},
            capture_output=True,
            text=True,
            timeout=60,
        )

    cli_key = str(uuid.uuid4())
    args = ("run", "stdio-json", "hello", "--executable", DEMO, "--json")
    one = cli(*args, "--idempotency-key", cli_key)
    two = cli(*args, "--idempotency-key", cli_key)
    assert one.returncode == two.returncode == 0, (one.stderr, two.stderr)
    assert one.stdout == two.stdout and "run_id" in one.stdout
    changed = cli("run", "stdio-json", "other", "--executable", DEMO, "--idempotency-key", cli_key)
    assert changed.returncode == 2 and "another request" in changed.stderr


def test_a_claim_held_is_in_progress_and_a_failure_frees_the_key(api_env: Env) -> None:  # noqa: F811
    client = api_env.client()
    keys = idempotency.Idempotency(client.redis, client.keys, 60, wait_s=0)
    key, name = str(uuid.uuid4()), keys.name("acme", "k")

    def nested() -> str:  # a duplicate that comes while the first is at work
        with pytest.raises(idempotency.IdempotencyInProgress):
            keys.once("acme", key, "print", lambda: "second")
        return "first"

    assert keys.once("acme", key, "print", nested) == "first"
    assert keys.once("acme", key, "print", lambda: "third") == "first"
    assert 0 < client.redis.ttl(keys.name("acme", key)) <= 60  # never kept without an expiry
    assert keys.once("other", key, "print", lambda: "theirs") == "theirs"

    def failing() -> str:
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        keys.once("acme", "k", "print", failing)
    assert client.redis.get(name) is None  # nothing was started: the key is free again
    assert keys.once("acme", "k", "print", lambda: "retried") == "retried"
