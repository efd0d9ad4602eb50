"""Triggers through the HTTP API (real uvicorn, Redis, worker; the demo harness in the local
sandbox): a GitHub-signed labelled issue starts a run from its title and body, labelled with
the trigger; a replay starts nothing; a bad signature, a filtered event, an oversized body
and a refused repository are recorded and start nothing; a Standard Webhooks source verifies
by its library's signature and refuses a stale timestamp; another tenant meets 404."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.integration.api_server import (  # noqa: F401
    ApiProcess,
    api,
    api_env,
    api_worker,
    start_api,
)
from tests.integration.conftest import DEMO, make_env
from tests.integration.test_api import wait_terminal

pytestmark = [pytest.mark.redis, pytest.mark.celery]

ISSUE = {
    "action": "labeled",
    "label": {"name": "agent"},
    "issue": {"number": 42, "title": "Crash on {__class__} {issue.body}", "body": "Steps: run it"},
    "repository": {"full_name": "acme/app", "clone_url": "file:///etc"},
}


def make_trigger(http: httpx.Client, name: str, **fields: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "source": "github",
        "harness": "stdio-json",
        "filter": {"event": "issues", "action": "labeled", "label": "agent"},
        "input_template": "Fix issue {issue.number}: {issue.title}\n\n{issue.body}",
        "label_templates": {"repo": "{repository.full_name}", "issue": "{issue.number}"},
        "run": {"executable": DEMO},
        **fields,
    }
    made = http.post("/v1/triggers", json=body)
    assert made.status_code == 201, made.text
    result: dict[str, Any] = made.json()
    return result


def github(
    http: httpx.Client,
    path: str,
    secret: str,
    payload: dict[str, Any],
    event: str = "issues",
    delivery: str | None = None,
) -> httpx.Response:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature,
        "Content-Type": "application/json",
    }
    return http.post(path, content=body, headers=headers)


def settled(http: httpx.Client, trigger_id: str, record_id: str) -> dict[str, Any]:
    """The delivery's record once its run started or did not."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for record in http.get(f"/v1/triggers/{trigger_id}/deliveries").json()["deliveries"]:
            if record["id"] == record_id and (record["run_id"] or record["status"] != "accepted"):
                return dict(record)
        time.sleep(0.1)
    raise AssertionError(f"delivery {record_id} did not settle")


def statuses(http: httpx.Client, trigger_id: str) -> list[str]:
    found = http.get(f"/v1/triggers/{trigger_id}/deliveries").json()["deliveries"]
    return [record["status"] for record in found]


def test_a_labelled_issue_starts_one_run(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, httpx.Client(base_url=api.url) as forge:
        trigger = make_trigger(http, "fix-issues")
        path, secret = trigger["path"], trigger["secret"]
        assert secret and path == f"/v1/triggers/{trigger['id']}"
        delivery = str(uuid.uuid4())
        accepted = github(forge, path, secret, ISSUE, delivery=delivery)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["status"] == "accepted"
        assert accepted.json()["delivery_id"] == delivery
        record = settled(http, trigger["id"], accepted.json()["id"])
        assert record["status"] == "accepted" and record["event"] == "issues"
        run_id = record["run_id"]
        run = http.get(f"/v1/runs/{run_id}").json()
        assert run["tenant"] == "acme"
        assert run["labels"] == {"trigger": "fix-issues", "issue": "42", "repo": "acme/app"}
        answer = wait_terminal(http, run_id, 1)
        assert answer["type"] == "turn-complete"
        # The title's braces are the payload's text: never a placeholder, never expanded.
        assert (
            "Fix issue 42: Crash on {__class__} {issue.body}\n\nSteps: run it"
            in (answer["data"]["text"])
        )

        # The same delivery again, and the same signed body under a new delivery id: no run.
        again = github(forge, path, secret, ISSUE, delivery=delivery)
        assert again.status_code == 200 and again.json()["duplicate"] is True
        renamed = github(forge, path, secret, ISSUE)
        assert renamed.status_code == 200 and renamed.json()["duplicate"] is True

        # A bad signature: 401, recorded refused, no run.
        forged = github(forge, path, "not-the-secret-at-all", {**ISSUE, "n": 1})
        assert forged.status_code == 401
        unsigned = forge.post(path, json=ISSUE, headers={"X-GitHub-Event": "issues"})
        assert unsigned.status_code == 401

        # An opened issue is filtered out: recorded, no run.
        opened = github(forge, path, secret, {**ISSUE, "action": "opened"})
        assert opened.status_code == 202 and opened.json()["status"] == "filtered"
        comment = github(forge, path, secret, {**ISSUE, "comment": {"body": "hi"}}, "issue_comment")
        assert comment.status_code == 202 and comment.json()["status"] == "filtered"

        # A body over the bound: 413.
        big = github(forge, path, secret, {**ISSUE, "pad": "x" * (1024 * 1024)})
        assert big.status_code == 413

        runs = http.get("/v1/runs", params={"label": "trigger=fix-issues"}).json()["runs"]
        assert [r["run_id"] for r in runs] == [run_id]
        assert statuses(http, trigger["id"]) == [
            "refused",  # too large
            "filtered",
            "filtered",
            "refused",  # no signature
            "refused",  # a wrong one
            "duplicate",
            "duplicate",
            "accepted",
        ]
        reasons = http.get(f"/v1/triggers/{trigger['id']}/deliveries").json()["deliveries"]
        assert "does not match" in reasons[4]["reason"]
        assert "'opened' is not 'labeled'" in reasons[2]["reason"]

        # The secret is answered once: masked in the list, nowhere in the API's log.
        listed = http.get("/v1/triggers").json()["triggers"]
        shown = next(t for t in listed if t["id"] == trigger["id"])
        assert shown["secret"] != secret and secret[:8] not in json.dumps(listed)
        assert secret not in api.logs()


def test_a_repository_from_the_payload_is_under_repo_policy(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, httpx.Client(base_url=api.url) as forge:
        trigger = make_trigger(http, "from-repo", repo_from_payload=True)
        sent = github(forge, trigger["path"], trigger["secret"], ISSUE)
        assert sent.status_code == 202, sent.text
        record = settled(http, trigger["id"], sent.json()["id"])
        assert record["status"] == "refused" and record["run_id"] is None
        assert "file" in record["reason"]
        assert http.get("/v1/runs", params={"label": "trigger=from-repo"}).json()["runs"] == []


def test_a_standard_webhooks_source(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, httpx.Client(base_url=api.url) as sender:
        trigger = make_trigger(
            http,
            "hooks",
            source="webhook",
            filter={"event": "task.created"},
            input_template="Do: {data.task}",
            label_templates={},
        )
        signer = Webhook(trigger["secret"])

        def send(payload: dict[str, Any], at: datetime) -> httpx.Response:
            body = json.dumps(payload).encode()
            msg_id = "msg_" + uuid.uuid4().hex
            headers = {
                "webhook-id": msg_id,
                "webhook-timestamp": str(int(at.timestamp())),
                "webhook-signature": signer.sign(msg_id, at, body),
            }
            return sender.post(trigger["path"], content=body, headers=headers)

        task = {"type": "task.created", "data": {"task": "say hello"}}
        accepted = send(task, datetime.now(UTC))
        assert accepted.status_code == 202 and accepted.json()["status"] == "accepted"
        record = settled(http, trigger["id"], accepted.json()["id"])
        answer = wait_terminal(http, record["run_id"], 1)
        assert "Do: say hello" in answer["data"]["text"]
        stale = send(task, datetime.now(UTC) - timedelta(minutes=10))
        assert stale.status_code == 401
        other = send({"type": "task.deleted", "data": {}}, datetime.now(UTC))
        assert other.status_code == 202 and other.json()["status"] == "filtered"
        assert statuses(http, trigger["id"]) == ["filtered", "refused", "accepted"]


def test_triggers_are_their_tenants_own(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http, api.client("other") as stranger:
        trigger = make_trigger(http, "private")
        assert stranger.delete(f"/v1/triggers/{trigger['id']}").status_code == 404
        assert stranger.get(f"/v1/triggers/{trigger['id']}/deliveries").status_code == 404
        assert all(
            t["id"] != trigger["id"] for t in stranger.get("/v1/triggers").json()["triggers"]
        )
        # The same name is another tenant's own.
        assert make_trigger(stranger, "private")["id"] != trigger["id"]
        taken = http.post("/v1/triggers", json={**_body("private")})
        assert taken.status_code == 400
        # Templates are placeholders of plain keys only: no attribute, conversion or spec.
        for template in ("{__class__}", "{issue.__dict__}", "{issue.title!r}", "{issue:>99999}"):
            refused = http.post(
                "/v1/triggers", json={**_body("tricks"), "input_template": template}
            )
            assert refused.status_code == 400, (template, refused.text)
            assert "no placeholder" in refused.json()["error"]["message"]
        assert httpx.post(f"{api.url}/v1/triggers", json=_body("x")).status_code == 401
        assert http.delete(f"/v1/triggers/{trigger['id']}").json()["removed"] is True
        gone = httpx.post(f"{api.url}{trigger['path']}", json=ISSUE)
        assert gone.status_code == 404
        assert http.get(f"/v1/triggers/{trigger['id']}/deliveries").status_code == 404


def _body(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "source": "github",
        "harness": "stdio-json",
        "input_template": "x",
        "run": {"executable": DEMO},
    }


def test_an_address_that_keeps_failing_signatures_or_guessing_ids_is_held_off(
    tmp_path: Path, redis_url: str
) -> None:
    """Bad signatures and unknown trigger ids count as wrong keys do: past the limit the
    address gets 429 before its body is read or hashed, a right signature's too. (An API of
    its own, on a key prefix of its own: the count is per address and prefix.)"""
    guarded = start_api(make_env(tmp_path, redis_url), "guarded", HARNESS_API_FAILED_AUTH_LIMIT="3")
    try:
        guarded.add_tenant("acme")
        with guarded.client("acme") as http:
            made = make_trigger(http, "guarded")
        with httpx.Client(base_url=guarded.url) as source:
            path = made["path"]
            assert github(source, path, "wrong", ISSUE).status_code == 401
            assert source.post("/v1/triggers/trg" + "0" * 24, content=b"{}").status_code == 404
            assert github(source, path, "wrong", ISSUE).status_code == 401
            held = github(source, path, made["secret"], {**ISSUE, "action": "opened"})
            assert held.status_code == 429 and "refused deliveries" in held.text
            assert int(held.headers["retry-after"]) >= 1
    finally:
        guarded.stop()
