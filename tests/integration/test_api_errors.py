"""The API's 4xx as docs/api.md's error table says them, against a real ``harness api``
process: a schema mismatch (an unknown filter value, a number out of range) is 422 naming
the field; a body that is not JSON says where (line and column), not a field path; and the
permission answer's ``by`` (the platform's user) recorded after the tenant."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.conftest import DEMO, Env

pytestmark = [pytest.mark.redis, pytest.mark.celery]

RUN = {"harness": "stdio-json", "executable": DEMO}
KNOWN = ("starting", "running", "idle", "parked", "ended", "failed")


def test_an_unknown_status_filter_is_422_naming_the_known_ones(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        refused = http.get("/v1/runs", params={"status": "bogus"})
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["type"] == "invalid_request" and error["path"] == "query.status"
        assert all(status in error["message"] for status in KNOWN)
        assert http.get("/v1/runs", params={"status": "idle"}).status_code == 200


def test_harness_list_refuses_an_unknown_status(api_env: Env) -> None:  # noqa: F811
    listed = subprocess.run(
        [sys.executable, "-m", "worker.cli", "list", "--status", "bogus"],
        cwd=ROOT,
        env={**os.environ, **api_env.vars},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 2, listed
    assert "bogus" in listed.stderr and all(status in listed.stderr for status in KNOWN)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_cost_usd", -1), ("max_turns", 10**7), ("timeout_s", 0), ("cpus", 5000)],
)
def test_an_option_out_of_range_is_422_as_a_budget_change_is(
    api: ApiProcess,  # noqa: F811
    field: str,
    value: float,
) -> None:
    with api.client("acme") as http:
        refused = http.post("/v1/runs", json={**RUN, "input": "x", field: value})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["path"] == f"body.{field}"


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [('{"harness": "stdio-json",\n "input": }', 2, 11), ("{nope", 1, 2), ('{"a": 1}}', 1, 9)],
)
def test_a_body_that_is_not_json_says_where(
    api: ApiProcess,  # noqa: F811
    text: str,
    line: int,
    column: int,
) -> None:
    headers = {"Content-Type": "application/json"}
    with api.client("acme") as http:
        for path in ("/v1/runs", f"/v1/runs/r{'0' * 24}/permissions/p1-1"):
            refused = http.post(path, content=text, headers=headers)
            if refused.status_code == 404:  # the route checks the run before the body
                continue
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["message"].startswith(f"invalid JSON at line {line} column {column}")
            assert error["path"] == "body"


def test_a_decision_answer_with_bad_json_says_where(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        run_id = http.post("/v1/runs", json={**RUN, "input": "x"}).json()["run_id"]
        refused = http.post(
            f"/v1/runs/{run_id}/permissions/p1-1",
            content='{"decision":\n\n  allow}',
            headers={"Content-Type": "application/json"},
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["message"].startswith("invalid JSON at line 3 column 3")


def answer_with(api: ApiProcess, by: object) -> tuple[httpx.Response, list[dict]]:  # noqa: F811
    with api.client("acme") as http:
        started = http.post(
            "/v1/runs", json={**RUN, "input": "@ask touch x\n@complete done", "posture": "ask"}
        )
        run_id = started.json()["run_id"]
        deadline = time.monotonic() + 30
        pending: list[dict] = []
        while not pending and time.monotonic() < deadline:
            pending = http.get(f"/v1/runs/{run_id}/permissions").json()
            time.sleep(0.1)
        assert pending, "no permission request"
        path = f"/v1/runs/{run_id}/permissions/{pending[0]['request_id']}"
        answered = http.post(path, json={"decision": "allow", "by": by})
        if answered.status_code != 200:
            http.post(path, json={"decision": "deny"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            events = http.get(f"/v1/runs/{run_id}/events").json()
            if any(e["type"] in ("turn-complete", "session-error") for e in events):
                return answered, events
            time.sleep(0.1)
        raise AssertionError("the turn did not end")


def test_the_platform_user_is_recorded_after_the_tenant(api: ApiProcess) -> None:  # noqa: F811
    answered, events = answer_with(api, "alice@platform.example")
    assert answered.status_code == 200, answered.text
    decision = next(e for e in events if e["type"] == "permission-decision")
    assert decision["data"]["by"] == "api:acme:alice@platform.example"
    assert decision["data"]["decision"] == "allow"


def test_a_tenant_cannot_pass_for_a_rule_or_the_worker(api: ApiProcess) -> None:  # noqa: F811
    answered, events = answer_with(api, "rule:always")
    assert answered.status_code == 200, answered.text
    decision = next(e for e in events if e["type"] == "permission-decision")
    assert decision["data"]["by"] == "api:acme:rule:always"


@pytest.mark.parametrize("by", ["", "x" * 129, "eve\nworker:deadline", 7])
def test_a_bad_user_is_422(api: ApiProcess, by: object) -> None:  # noqa: F811
    with api.client("acme") as http:
        refused = http.post(
            f"/v1/runs/r{uuid.uuid4().hex[:24]}/permissions/p1-1",
            json={"decision": "allow", "by": by},
        )
        # an unknown run is 404 before the body; a known one's bad body is 422
        assert refused.status_code in (404, 422), refused.text
        run_id = http.post("/v1/runs", json={**RUN, "input": "x"}).json()["run_id"]
        refused = http.post(
            f"/v1/runs/{run_id}/permissions/p1-1", json={"decision": "allow", "by": by}
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["path"] == "body.by"
