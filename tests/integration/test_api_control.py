"""Control over running work through the HTTP API (real uvicorn, Redis, worker; the demo
harness in the local sandbox): messages to a run, a fork, a group of attempts compared,
diffed and picked; another tenant gets 404 for each; a read page link reads its run's group
and may not send messages, an approve link may."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.test_api import RUN, start, wait_terminal

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def wait_event(http: httpx.Client, run_id: str, kind: str, turn: int = 1) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for event in http.get(f"/v1/runs/{run_id}/events").json():
            if event["id"].startswith(f"{turn}-") and event["type"] == kind:
                return event
        time.sleep(0.1)
    raise AssertionError(f"no {kind} in turn {turn}")


def test_messages_through_the_api(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, api.client("other") as stranger:
        run_id = start(http, "@text busy\n@wait-message 30", posture="ask")
        wait_event(http, run_id, "assistant-text")
        sent = http.post(
            f"/v1/runs/{run_id}/messages", json={"text": "use tabs", "mode": "steer", "by": "ana"}
        )
        assert sent.status_code == 202, sent.text
        assert sent.json()["state"] == "sent-to-turn" and sent.json()["turn"] == 1
        assert wait_terminal(http, run_id, 1)["type"] == "turn-complete"
        said = wait_event(http, run_id, "user-message")["data"]
        assert said["by"] == "api:acme:ana" and said["delivery"] == "native"
        queued = http.post(f"/v1/runs/{run_id}/messages", json={"text": "next one"})
        assert queued.status_code == 202 and queued.json()["state"] == "started"
        assert wait_terminal(http, run_id, 2)["type"] == "turn-complete"
        assert stranger.post(f"/v1/runs/{run_id}/messages", json={"text": "x"}).status_code == 404
        bad = http.post(f"/v1/runs/{run_id}/messages", json={"text": "x", "mode": "shout"})
        assert bad.status_code == 422
        assert http.post(f"/v1/runs/{run_id}/messages", json={"text": ""}).status_code == 422
        assert http.delete(f"/v1/runs/{run_id}").status_code == 200
        ended = http.post(f"/v1/runs/{run_id}/messages", json={"text": "late"})
        assert ended.status_code == 409 and ended.json()["error"]["type"] == "run_ended"


def test_a_fork_through_the_api(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, api.client("other") as stranger:
        run_id = start(http, "first words")
        wait_terminal(http, run_id, 1)
        assert stranger.post(f"/v1/runs/{run_id}/fork", json={"input": "x"}).status_code == 404
        too_far = http.post(f"/v1/runs/{run_id}/fork", json={"input": "x", "at_turn": 5})
        assert too_far.status_code == 400
        forked = http.post(f"/v1/runs/{run_id}/fork", json={"input": "go on", "at_turn": 1})
        assert forked.status_code == 201, forked.text
        body = forked.json()
        assert body["forked_from"] == run_id and body["forked_at_turn"] == 1
        answer = wait_terminal(http, body["run_id"], 1)
        assert answer["type"] == "turn-complete" and "first words" in answer["data"]["text"]
        record = http.get(f"/v1/runs/{body['run_id']}").json()
        assert record["tenant"] == "acme" and record["forked_from"] == run_id
        assert stranger.get(f"/v1/runs/{body['run_id']}").status_code == 404


def test_a_group_of_attempts_through_the_api(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, api.client("other") as stranger:
        made = http.post("/v1/runs", json={**RUN, "input": "hello", "attempts": 3})
        assert made.status_code == 201, made.text
        group, runs = made.json()["group"], made.json()["runs"]
        assert made.json()["run_id"] == runs[0] and len(runs) == 3
        for run_id in runs:
            wait_terminal(http, run_id, 1)
        table = http.get(f"/v1/groups/{group}")
        assert table.status_code == 200
        rows = table.json()["attempts"]
        assert [r["index"] for r in rows] == [1, 2, 3]
        assert {r["outcome"] for r in rows} == {"complete"}
        assert stranger.get(f"/v1/groups/{group}").status_code == 404
        assert stranger.post(f"/v1/groups/{group}/pick", json={"attempt": 1}).status_code == 404
        diff = http.get(f"/v1/groups/{group}/diff", params={"a": 1, "b": 2})
        assert diff.status_code == 200 and diff.headers["content-type"].startswith("text/x-diff")
        assert http.get(f"/v1/groups/{group}/diff", params={"a": 1, "b": 9}).status_code == 400

        # A page link of one of the group's runs reads the group; a read link sends nothing.
        link = http.post(f"/v1/runs/{runs[0]}/links", json={"mode": "read"}).json()
        token = link["path"].split("#link=")[1].split("&")[0]
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}) as page:
            assert page.get(f"/v1/groups/{group}").status_code == 200
            refused = page.post(f"/v1/runs/{runs[0]}/messages", json={"text": "hi"})
            assert refused.status_code == 403
        other_group = http.post("/v1/runs", json={**RUN, "input": "x", "attempts": 1}).json()
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}) as page:
            assert page.get(f"/v1/groups/{other_group['group']}").status_code == 401

        picked = http.post(f"/v1/groups/{group}/pick", json={"attempt": 3})
        assert picked.status_code == 200, picked.text
        assert picked.json()["run_id"] == runs[2]
        again = http.post(f"/v1/groups/{group}/pick", json={"attempt": 1})
        assert again.status_code == 409
        assert http.get(f"/v1/groups/{group}").json()["picked"] == 3
        many = http.post("/v1/runs", json={**RUN, "input": "x", "attempts": 17})
        assert many.status_code == 422


def test_a_fork_and_attempts_stay_within_the_tenants_policy(api: ApiProcess) -> None:  # noqa: F811
    from worker.api.tenants import TenantPolicy

    api.add_tenant("strict", policy=TenantPolicy(harnesses=("stdio-json",)))
    with api.client("strict") as http:
        run_id = start(http, "within")
        wait_terminal(http, run_id, 1)
        refused = http.post(f"/v1/runs/{run_id}/fork", json={"input": "x", "harness": "codex"})
        assert refused.status_code == 400 and "tenant strict" in refused.json()["error"]["message"]
        spread = http.post(
            "/v1/runs", json={**RUN, "harness": "stdio-json,codex", "input": "x", "attempts": 2}
        )
        assert spread.status_code == 400 and "tenant strict" in spread.json()["error"]["message"]
        graded = http.post(
            "/v1/runs", json={**RUN, "input": "x", "outcome": "tests pass", "grader": "codex"}
        )
        assert graded.status_code == 400 and "grader harness" in graded.json()["error"]["message"]
        listed = http.get("/v1/runs").json()["runs"]
        assert [r["run_id"] for r in listed] == [run_id]  # nothing half-made
