"""Schedules through the HTTP API with two real workers firing them (worker/schedules/): each
tick starts exactly one run, labelled with its schedule; runs that fail at once pause it; and
a tenant never reaches another's schedule."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import DEMO, Env, make_env, start_worker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

EVERY_2S = "*/2 * * * * *"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[ApiProcess]:
    """An API and two workers whose reaper ticks every half second (a firing's precision)."""
    env: Env = make_env(
        Path(tmp_path_factory.mktemp("schedules")),
        redis_url,
        HARNESS_REAP_INTERVAL_S="2",
        HARNESS_SCHEDULE_MAX_FAILURES="2",
    )
    workers = [start_worker(env), start_worker(env)]
    server = start_api(env)
    server.add_tenant("acme")
    server.add_tenant("other")
    yield server
    server.stop()
    for worker in workers:
        worker.stop()
    env.close()


def add(http: httpx.Client, name: str, **body: Any) -> dict[str, Any]:
    body = {"name": name, "cron": EVERY_2S, "harness": "stdio-json", **body}
    response = http.post("/v1/schedules", json=body)
    assert response.status_code == 201, response.text
    shown: dict[str, Any] = response.json()
    return shown


def wait_for(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_two_workers_start_exactly_one_run_per_tick(fleet: ApiProcess) -> None:
    with fleet.client("acme") as http:
        add(http, "every2s", input="tick", executable=DEMO, labels={"team": "blue"})
        wait_for(lambda: len(http.get("/v1/schedules/every2s/history").json()) >= 4)
        paused = http.post("/v1/schedules/every2s/pause").json()
        assert paused["paused"] and paused["next_at"] is None
        time.sleep(1)  # a firing that claimed its tick before the pause records it
        history = http.get("/v1/schedules/every2s/history").json()
        ticks = [entry["tick"] for entry in history]
        assert len(ticks) == len(set(ticks)), history  # never twice for one tick
        assert all(tick % 2 == 0 for tick in ticks)
        started = {entry["run_id"] for entry in history}
        assert None not in started, history
        runs = http.get("/v1/runs", params={"label": "schedule=every2s"}).json()["runs"]
        assert {run["run_id"] for run in runs} == started  # one run per firing, labelled
        assert all(run["labels"] == {"team": "blue", "schedule": "every2s"} for run in runs)
        record = wait_for(
            lambda: [
                r for r in runs if http.get(f"/v1/runs/{r['run_id']}").json()["status"] == "idle"
            ]
        )[0]
        events = http.get(f"/v1/runs/{record['run_id']}/events").json()
        assert any(
            e["type"] == "turn-complete" and "You said: tick" in e["data"]["text"] for e in events
        )
        assert http.get("/v1/schedules/every2s").json()["paused_reason"] == "paused by request"


def test_a_schedule_whose_runs_fail_at_once_pauses_itself(fleet: ApiProcess) -> None:
    with fleet.client("acme") as http:
        add(http, "failing", input="x", executable="/bin/false")
        shown = wait_for(lambda: (s := http.get("/v1/schedules/failing").json())["paused"] and s)
        assert "2 firings in a row failed" in shown["paused_reason"], shown
        assert "first turn failed" in shown["paused_reason"]
        history = http.get("/v1/schedules/failing/history").json()
        assert history[0]["error"] == shown["last_error"]


def test_a_tenant_never_reaches_another_tenants_schedule(fleet: ApiProcess) -> None:
    with fleet.client("acme") as acme, fleet.client("other") as other:
        add(acme, "mine", cron="0 9 * * *", tz="Europe/Berlin", input="x", executable=DEMO)
        for method, path in (
            ("GET", "/v1/schedules/mine"),
            ("POST", "/v1/schedules/mine/pause"),
            ("POST", "/v1/schedules/mine/resume"),
            ("GET", "/v1/schedules/mine/history"),
            ("DELETE", "/v1/schedules/mine"),
        ):
            assert other.request(method, path).status_code == 404, (method, path)
        assert "mine" not in [s["name"] for s in other.get("/v1/schedules").json()]
        add(other, "mine", cron="0 9 * * *", input="theirs", executable=DEMO)  # its own name
        assert acme.get("/v1/schedules/mine").json()["input"] == "x"
        again = acme.post("/v1/schedules", json={"name": "mine", "cron": "* * * * *",
                                                 "harness": "stdio-json", "input": "x", "executable": DEMO})  # fmt: skip
        assert again.status_code == 409
        bad = acme.post("/v1/schedules", json={"name": "b", "cron": "61 * * * *",
                                               "harness": "stdio-json", "input": "x", "executable": DEMO})  # fmt: skip
        assert bad.status_code == 400 and "cron" in bad.text
        assert acme.delete("/v1/schedules/mine").status_code == 204
        assert acme.get("/v1/schedules/mine").status_code == 404
        assert other.get("/v1/schedules/mine").json()["input"] == "theirs"
