"""The HTTP API against a real uvicorn process, real Redis and a real worker (demo harness,
local sandbox): runs, turns, events, permissions, the workspace, budgets, listing, tenants
kept apart, and its errors."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from http.client import HTTPConnection
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.images import png
from tests.integration.api_server import ApiProcess, api, api_env, api_worker, start_api  # noqa: F401
from tests.integration.conftest import DEMO

pytestmark = [pytest.mark.redis, pytest.mark.celery]

RUN = {"harness": "stdio-json", "executable": DEMO}


def start(http: httpx.Client, text: str, **options: Any) -> str:
    response = http.post("/v1/runs", json={**RUN, "input": text, **options})
    assert response.status_code == 201, response.text
    assert response.json()["turn"] == 1
    run_id: str = response.json()["run_id"]
    return run_id


def wait_terminal(http: httpx.Client, run_id: str, turn: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = http.get(f"/v1/runs/{run_id}/events").json()
        for event in events:
            if event["id"].startswith(f"{turn}-") and event["type"] in (
                "turn-complete",
                "session-error",
            ):
                return event
        time.sleep(0.1)
    raise AssertionError(f"turn {turn} of {run_id} did not end")


def wait_pending(http: httpx.Client, run_id: str) -> list[dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pending = http.get(f"/v1/runs/{run_id}/permissions").json()
        if pending:
            return pending
        time.sleep(0.1)
    raise AssertionError("no pending request")


def test_a_run_is_driven_through_the_api(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        run_id = start(http, "hello api", labels={"team": "blue"})
        first = wait_terminal(http, run_id, 1)
        assert first["type"] == "turn-complete"
        assert first["data"]["text"] == "You said: hello api"
        record = http.get(f"/v1/runs/{run_id}").json()
        assert record["status"] == "idle" and record["tenant"] == "acme"
        assert record["options"]["producer"] == "acme"  # a key's slots: fair across tenants
        assert record["labels"] == {"team": "blue"}
        events = http.get(f"/v1/runs/{run_id}/events").json()
        after = http.get(f"/v1/runs/{run_id}/events", params={"after": events[2]["id"]}).json()
        assert after == events[3:]
        turn = http.post(f"/v1/runs/{run_id}/turns", json={"input": "again"})
        assert turn.status_code == 202 and turn.json() == {"run_id": run_id, "turn": 2}
        assert "(turn 2 of this session)" in wait_terminal(http, run_id, 2)["data"]["text"]
        diff = http.get(f"/v1/runs/{run_id}/diff")
        assert diff.status_code == 200 and diff.headers["content-type"].startswith("text/x-diff")
        export = http.get(f"/v1/runs/{run_id}/export")
        assert export.status_code == 200 and export.content[:2] == b"\x1f\x8b"
        rewound = http.post(f"/v1/runs/{run_id}/rewind", json={"turn": 1})
        assert rewound.status_code == 200, rewound.text
        budget = http.patch(f"/v1/runs/{run_id}/budget", json={"max_turns": 5})
        assert budget.status_code == 200 and budget.json()["budget"]["max_turns"] == 5
        assert http.post(f"/v1/runs/{run_id}/cancel").json() == {
            "run_id": run_id,
            "cancelled": False,
        }
        ended = http.delete(f"/v1/runs/{run_id}", params={"wait": 30})
        assert ended.status_code == 200 and ended.json()["status"] == "ended"
        refused = http.post(f"/v1/runs/{run_id}/turns", json={"input": "more"})
        assert refused.status_code == 409
        assert refused.json()["error"]["type"] == "run_ended"


def test_a_busy_run_refuses_a_turn_with_409(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        run_id = start(http, "@sleep 30\n@complete late")
        busy = http.post(f"/v1/runs/{run_id}/turns", json={"input": "now"})
        assert busy.status_code == 409 and busy.json()["error"]["type"] == "run_busy"
        assert http.post(f"/v1/runs/{run_id}/cancel").json()["cancelled"] is True
        assert wait_terminal(http, run_id, 1)["type"] == "session-error"


def test_a_permission_request_is_answered_through_the_api(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        run_id = start(http, "@ask touch made.txt\n@complete done", posture="ask")
        (request,) = wait_pending(http, run_id)
        path = f"/v1/runs/{run_id}/permissions/{request['request_id']}"
        answered = http.post(path, json={"decision": "allow"})
        assert answered.status_code == 200, answered.text
        again = http.post(path, json={"decision": "deny", "message": "too late"})
        assert again.status_code == 409 and again.json()["error"]["type"] == "answer_refused"
        unknown = http.post(f"/v1/runs/{run_id}/permissions/nope", json={"decision": "allow"})
        assert unknown.status_code == 404
        assert wait_terminal(http, run_id, 1)["type"] == "turn-complete"
        decision = next(
            e
            for e in http.get(f"/v1/runs/{run_id}/events").json()
            if e["type"] == "permission-decision"
        )
        assert decision["data"]["by"] == "api:acme"


def test_runs_are_listed_newest_first_with_filters_and_a_cursor(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        label = f"batch-{time.monotonic_ns()}"
        made = [start(http, f"n{i}", labels={"batch": label, "i": str(i)}) for i in range(3)]
        first = http.get("/v1/runs", params={"label": f"batch={label}", "limit": 2}).json()
        assert [r["run_id"] for r in first["runs"]] == made[::-1][:2]
        rest = http.get(
            "/v1/runs", params={"label": f"batch={label}", "limit": 2, "cursor": first["cursor"]}
        ).json()
        assert [r["run_id"] for r in rest["runs"]] == made[:1] and rest["cursor"] is None
        both = http.get("/v1/runs", params=[("label", f"batch={label}"), ("label", "i=1")])
        assert [r["run_id"] for r in both.json()["runs"]] == [made[1]]
        other = http.get("/v1/runs", params={"harness": "codex"}).json()
        assert other["runs"] == []
    with api.client("other") as http:
        assert http.get("/v1/runs", params={"label": f"batch={label}"}).json()["runs"] == []


def test_another_tenant_gets_404_on_every_endpoint(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as mine:
        run_id = start(mine, "@ask touch x\n@complete done", posture="ask")
        (request,) = wait_pending(mine, run_id)
    calls: list[tuple[str, str, dict | None]] = [
        ("GET", "", None),
        ("POST", "/turns", {"input": "hi"}),
        ("GET", "/events", None),
        ("GET", "/events/stream", None),
        ("POST", "/cancel", None),
        ("GET", "/permissions", None),
        ("POST", f"/permissions/{request['request_id']}", {"decision": "allow"}),
        ("GET", "/diff", None),
        ("GET", "/export", None),
        ("POST", "/rewind", {"turn": 0}),
        ("PATCH", "/budget", {"max_turns": 9}),
        ("DELETE", "", None),
    ]
    unknown = "r" + "0" * 24
    with api.client("other") as theirs:
        for method, tail, body in calls:
            for target in (run_id, unknown):
                response = theirs.request(method, f"/v1/runs/{target}{tail}", json=body)
                assert response.status_code == 404, (method, tail, response.text)
                assert response.json() == {
                    "error": {"type": "not_found", "message": f"unknown run {target!r}"}
                }
    with api.client("acme") as mine:
        assert mine.get(f"/v1/runs/{run_id}/permissions").json() == [request]  # untouched
        mine.post(f"/v1/runs/{run_id}/cancel")


def test_errors_are_json_with_the_right_status(api: ApiProcess, tmp_path: Any) -> None:  # noqa: F811
    with api.client() as anonymous:
        missing = anonymous.get("/v1/runs")
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "unauthorized"
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.get("/v1/runs", headers={"Authorization": "Bearer hk_nope"})
        assert wrong.status_code == 401
        assert anonymous.get("/v1/healthz").json() == {"ok": True}
    with api.client("acme") as http:
        no_input = http.post("/v1/runs", json={"harness": "stdio-json"})
        assert no_input.status_code == 422
        assert no_input.json()["error"]["path"] == "body.input"
        bad_label = http.post("/v1/runs", json={**RUN, "input": "x", "labels": {"k": 3}})
        assert bad_label.status_code == 422 and bad_label.json()["error"]["path"] == "body.labels.k"
        for field, value in (("colour", "red"), ("producer", "someone-else"), ("archive", "/etc")):
            unknown_field = http.post("/v1/runs", json={**RUN, "input": "x", field: value})
            assert unknown_field.status_code == 422
            assert unknown_field.json()["error"]["path"] == f"body.{field}"
        bad_harness = http.post("/v1/runs", json={"harness": "nope", "input": "x"})
        assert bad_harness.status_code == 400
        assert "unknown harness" in bad_harness.json()["error"]["message"]
        not_json = http.post("/v1/runs", content=b"{", headers={"content-type": "application/json"})
        assert not_json.status_code == 422
        huge = http.post("/v1/runs", content=b"x" * (18 * 1024 * 1024))
        assert huge.status_code == 413 and huge.json()["error"]["type"] == "too_large"
        bad_after = http.get(f"/v1/runs/{'r' + '0' * 24}/events", params={"after": "x"})
        assert bad_after.status_code == 404  # ownership is checked first: nothing is said
        assert http.get("/v1/nothing").status_code == 404
    for response in (missing, no_input, bad_harness, huge):
        text = response.text
        assert "redis://" not in text and "/tmp/" not in text


def test_a_tenant_over_its_rate_limit_gets_429_with_retry_after(
    api: ApiProcess,  # noqa: F811
) -> None:
    api.add_tenant("hasty", rate_limit=3)
    with api.client("hasty") as http:
        statuses = [http.get("/v1/runs").status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        refused = http.get("/v1/runs")
        assert refused.json()["error"]["type"] == "rate_limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60


def test_tenant_policy_narrows_what_a_run_may_ask(api: ApiProcess) -> None:  # noqa: F811
    from worker.api.tenants import TenantPolicy

    api.add_tenant("narrow", policy=TenantPolicy(harnesses=("stdio-json",), max_turns=1))
    with api.client("narrow") as http:
        refused = http.post("/v1/runs", json={"harness": "codex", "input": "x"})
        assert refused.status_code == 400 and "tenant narrow" in refused.json()["error"]["message"]
        over = http.post("/v1/runs", json={**RUN, "input": "x", "max_turns": 2})
        assert over.status_code == 400 and "ceiling" in over.json()["error"]["message"]
        run_id = start(http, "within")
        assert http.get(f"/v1/runs/{run_id}").json()["budget"]["max_turns"] == 1
        raise_it = http.patch(f"/v1/runs/{run_id}/budget", json={"max_turns": 0})
        assert raise_it.status_code == 400


def test_a_revoked_key_is_refused_at_its_next_request(api: ApiProcess) -> None:  # noqa: F811
    from worker.api import tenants

    api.add_tenant("leaving")
    with api.client("leaving") as http:
        assert http.get("/v1/runs").status_code == 200
        tenants.revoke(api.tenants_file, "leaving")
        deadline = time.monotonic() + 5
        while http.get("/v1/runs").status_code != 401:
            assert time.monotonic() < deadline, "the revoked key still works"
            time.sleep(0.05)


def test_every_route_is_in_openapi_with_its_errors(api: ApiProcess) -> None:  # noqa: F811
    spec = httpx.get(f"{api.url}/openapi.json").json()
    expected = {
        ("post", "/v1/runs"),
        ("get", "/v1/runs"),
        ("post", "/v1/runs/{run_id}/turns"),
        ("get", "/v1/runs/{run_id}"),
        ("get", "/v1/runs/{run_id}/events"),
        ("get", "/v1/runs/{run_id}/events/stream"),
        ("post", "/v1/runs/{run_id}/cancel"),
        ("delete", "/v1/runs/{run_id}"),
        ("get", "/v1/runs/{run_id}/permissions"),
        ("post", "/v1/runs/{run_id}/permissions/{request_id}"),
        ("get", "/v1/runs/{run_id}/diff"),
        ("get", "/v1/runs/{run_id}/export"),
        ("post", "/v1/runs/{run_id}/rewind"),
        ("patch", "/v1/runs/{run_id}/budget"),
        ("post", "/v1/runs/{run_id}/links"),
        ("delete", "/v1/runs/{run_id}/links/{link_id}"),
        ("post", "/v1/runs/{run_id}/messages"),
        ("post", "/v1/runs/{run_id}/fork"),
        ("get", "/v1/groups/{group}"),
        ("get", "/v1/groups/{group}/diff"),
        ("post", "/v1/groups/{group}/pick"),
        ("post", "/v1/schedules"),
        ("get", "/v1/schedules"),
        ("get", "/v1/schedules/{name}"),
        ("delete", "/v1/schedules/{name}"),
        ("post", "/v1/schedules/{name}/pause"),
        ("post", "/v1/schedules/{name}/resume"),
        ("get", "/v1/schedules/{name}/history"),
        ("post", "/v1/triggers"),
        ("get", "/v1/triggers"),
        ("delete", "/v1/triggers/{trigger_id}"),
        ("get", "/v1/triggers/{trigger_id}/deliveries"),
        ("post", "/v1/triggers/{trigger_id}"),
        ("get", "/v1/healthz"),
    }
    found = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert found == expected
    for method, path in expected - {("get", "/v1/healthz")}:
        responses = spec["paths"][path][method]["responses"]
        for status in ("401", "422", "429"):
            assert status in responses, (method, path, status)
        if any(part in path for part in ("{run_id}", "{group}", "{name}", "{trigger_id}")):
            assert "404" in responses, (method, path)
    run_fields = spec["components"]["schemas"]["RunCreate"]["properties"]
    assert {"harness", "input", "labels", "webhook_url", "posture", "max_cost_usd"} <= set(
        run_fields
    )


def _archive(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _multipart(run: dict[str, Any], archive: bytes | None) -> dict[str, Any]:
    parts: dict[str, Any] = {"run": (None, json.dumps(run), "application/json")}
    if archive is not None:
        parts["archive"] = ("seed.tar.gz", archive, "application/gzip")
    return parts


def test_a_run_is_seeded_from_an_archive_sent_with_it(api: ApiProcess) -> None:  # noqa: F811
    archive = _archive({"hello.txt": b"hello from the uploaded archive\n"})
    run = {**RUN, "input": "@run cat hello.txt\n@complete seeded"}
    with api.client("acme") as http:
        created = http.post("/v1/runs", files=_multipart(run, archive))
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        assert wait_terminal(http, run_id, 1)["type"] == "turn-complete"
        events = http.get(f"/v1/runs/{run_id}/events").text
        assert "hello from the uploaded archive" in events
        record = http.get(f"/v1/runs/{run_id}").json()
        assert record["seed"] == f"archive sha256:{hashlib.sha256(archive).hexdigest()}"
        assert record["options"]["archive_bytes"] == len(archive)
        # The form's parts are checked as the JSON body is: the run's JSON, then both parts.
        bad = http.post("/v1/runs", files=_multipart({**run, "colour": "red"}, archive))
        assert bad.status_code == 422 and bad.json()["error"]["path"] == "body.colour"
        nameless = http.post("/v1/runs", files={"archive": ("seed.tar.gz", archive)})
        assert nameless.status_code == 400
        assert "'run' part" in nameless.json()["error"]["message"]
    spec = httpx.get(f"{api.url}/openapi.json").json()
    body = spec["paths"]["/v1/runs"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}


def test_an_archive_over_the_ceiling_is_413(api_env: Any, tmp_path: Any) -> None:  # noqa: F811
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    small = start_api(
        api_env,
        name="small-archives",
        HARNESS_ARCHIVE_MAX_BYTES="2000",
        HARNESS_TENANTS_FILE=str(tmp_path / "tenants.json"),
        TMPDIR=str(scratch),
    )
    try:
        small.add_tenant("acme")
        run = {**RUN, "input": "@complete never"}
        with small.client("acme") as http:
            over = http.post("/v1/runs", files=_multipart(run, b"\0" * 2001))
            assert over.status_code == 413 and over.json()["error"]["type"] == "too_large"
            assert "HARNESS_ARCHIVE_MAX_BYTES" in over.json()["error"]["message"]
            within = http.post("/v1/runs", files=_multipart(run, _archive({"a.txt": b"a"})))
            assert within.status_code == 201, within.text
        assert not list(scratch.iterdir())  # the archive's file lasts as long as its request
        # Far past it: refused by its Content-Length, before a byte of the body is read.
        address = urlsplit(small.url)
        raw = HTTPConnection(address.hostname or "", address.port, timeout=10)
        raw.putrequest("POST", "/v1/runs")
        raw.putheader("Authorization", f"Bearer {small.keys['acme']}")
        raw.putheader("Content-Type", "multipart/form-data; boundary=x")
        # (past the body limit, the archive's and the attachments' together: 25 MiB default)
        raw.putheader("Content-Length", str(18 * 1024 * 1024 + 2001 + 25 * 1024 * 1024))
        raw.endheaders()
        assert raw.getresponse().status == 413
        raw.close()
    finally:
        small.stop()


def test_a_run_and_a_turn_carry_files_and_a_turn_its_own_schema(
    api: ApiProcess,  # noqa: F811
) -> None:
    image, notes = png(), b"the spec\n"
    run = {**RUN, "input": "@attachments\n@complete seen"}
    parts: list[tuple[str, Any]] = [
        ("run", (None, json.dumps(run), "application/json")),
        ("attachment", ("shot.png", image, "image/png")),
        ("attachment", ("notes.txt", notes, "text/plain")),
    ]
    with api.client("acme") as http:
        created = http.post("/v1/runs", files=parts)
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        assert wait_terminal(http, run_id, 1)["type"] == "turn-complete"
        said = [
            e["data"]["text"]
            for e in http.get(f"/v1/runs/{run_id}/events").json()
            if e["type"] == "assistant-text"
        ]
        for name, data, kind in (
            ("shot.png", image, "image/png"),
            ("notes.txt", notes, "application/octet-stream"),
        ):
            digest = hashlib.sha256(data).hexdigest()
            assert any(
                t.endswith(f"/.attachments/turn-1/{name} {kind} {len(data)} {digest}") for t in said
            ), said
        # A turn: its files beside its JSON, and a schema of its own that its answer meets.
        turn = {"input": "@answer-attachments", "output_schema": {"type": "object"}}
        sent = http.post(
            f"/v1/runs/{run_id}/turns",
            files=[
                ("turn", (None, json.dumps(turn), "application/json")),
                ("attachment", ("shot.png", image, "image/png")),
            ],
        )
        assert sent.status_code == 202, sent.text
        done = wait_terminal(http, run_id, 2)
        assert done["type"] == "turn-complete", done
        (found,) = done["data"]["structured"]["attachments"]
        assert found["sha256"] == hashlib.sha256(image).hexdigest()
        # A file that says it is an image and is not: refused, one JSON error, nothing sent.
        lie = http.post(
            f"/v1/runs/{run_id}/turns",
            files=[
                ("turn", (None, json.dumps({"input": "x"}), "application/json")),
                ("attachment", ("fake.png", b"not a png at all", "image/png")),
            ],
        )
        assert lie.status_code in (400, 422), lie.text
        assert "fake.png" in lie.json()["error"]["message"]
        assert http.get(f"/v1/runs/{run_id}").json()["turns"] == 2
        # A plain JSON turn still works as before.
        plain = http.post(f"/v1/runs/{run_id}/turns", json={"input": "@complete plain"})
        assert plain.status_code == 202, plain.text
    spec = httpx.get(f"{api.url}/openapi.json").json()
    body = spec["paths"]["/v1/runs/{run_id}/turns"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
