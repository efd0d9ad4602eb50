"""Webhooks of the API: a run's terminal events and its end POSTed, signed as Standard
Webhooks does (checked with the ``standardwebhooks`` library), retried with the same id until
a 2xx, a delivery surviving the API process that died sending it, and URLs policy refuses."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.integration.api_server import ApiProcess, api_env, api_worker, start_api  # noqa: F401
from tests.integration.conftest import DEMO, Env, WorkerProcess
from tests.integration.test_api import start

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@dataclass
class Receiver:
    """An HTTP endpoint that records what it is sent and answers from a script."""

    server: ThreadingHTTPServer
    replies: list[int] = field(default_factory=list)
    """Statuses to answer, in order; then 200. A 0 hangs (the sender's timeout ends it)."""
    got: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 60) -> list[tuple[dict[str, str], bytes, int]]:
        deadline = time.monotonic() + timeout
        while len(self.got) < count:
            assert time.monotonic() < deadline, f"{len(self.got)} deliveries, not {count}"
            time.sleep(0.05)
        return list(self.got)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            box = holder[0]
            status = box.replies.pop(0) if box.replies else 200
            box.got.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
            if status == 0:
                time.sleep(30)
                status = 200
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    server.shutdown()


HOOKS = {
    "HARNESS_WEBHOOK_SCHEMES": "http",
    "HARNESS_WEBHOOK_HOSTS": "127.0.0.1",
    "HARNESS_WEBHOOK_BACKOFF_S": "0.2",
    "HARNESS_WEBHOOK_POLL_S": "0.1",
    "HARNESS_WEBHOOK_TIMEOUT_S": "2",
    "HARNESS_WEBHOOK_LEASE_S": "3",
}


@pytest.fixture
def hooked(api_env: Env, api_worker: WorkerProcess) -> Iterator[ApiProcess]:  # noqa: F811
    server = start_api(api_env, "hooks", **HOOKS)
    yield server
    server.stop()


def _verified(secret: str, delivery: tuple[dict[str, str], bytes, int]) -> dict[str, Any]:
    headers, body, _ = delivery
    verified: dict[str, Any] = Webhook(secret).verify(body, headers)
    return verified


def test_terminal_events_and_the_end_are_delivered_signed_and_retried(
    hooked: ApiProcess, receiver: Receiver
) -> None:
    hooked.add_tenant("hooks")
    secret = next(t for t in _tenants(hooked) if t["name"] == "hooks")["webhook_secret"]
    receiver.replies = [500, 503]  # the first delivery is refused twice, then taken
    with hooked.client("hooks") as http:
        run_id = start(http, "hello hooks", webhook_url=receiver.url)
        first = receiver.wait(3)
        ids = {headers["webhook-id"] for headers, _, _ in first}
        assert ids == {f"msg_{run_id}_1-7"}  # the same id at every attempt
        payload = _verified(secret, first[-1])
        assert payload["type"] == "turn-complete"
        assert payload["data"]["run_id"] == run_id
        assert payload["data"]["event"]["text"] == "You said: hello hooks"
        http.delete(f"/v1/runs/{run_id}", params={"wait": 30})
        ended = receiver.wait(4, timeout=30)[-1]
        assert _verified(secret, ended)["type"] == "run-ended"
        assert ended[0]["webhook-id"] == f"msg_{run_id}_end"
    tampered = (first[-1][0], first[-1][1].replace(b"hello", b"HELLO"), 200)
    with pytest.raises(WebhookVerificationError):
        _verified(secret, tampered)


def test_a_delivery_outlives_the_api_process_that_died_sending_it(
    api_env: Env,  # noqa: F811
    hooked: ApiProcess,
    receiver: Receiver,
) -> None:
    hooked.add_tenant("durable")
    secret = next(t for t in _tenants(hooked) if t["name"] == "durable")["webhook_secret"]
    receiver.replies = [0]  # the first attempt hangs: the API is killed meanwhile
    with hooked.client("durable") as http:
        run_id = start(http, "survive", webhook_url=receiver.url)
    receiver.wait(1)
    os.killpg(hooked.proc.pid, signal.SIGKILL)
    hooked.proc.wait(10)
    successor = start_api(api_env, "successor", **HOOKS)
    try:
        deliveries = receiver.wait(2, timeout=30)
        assert deliveries[0][0]["webhook-id"] == deliveries[1][0]["webhook-id"]
        assert _verified(secret, deliveries[1])["data"]["run_id"] == run_id
    finally:
        successor.stop()


def test_webhook_urls_policy_does_not_allow_are_refused(
    hooked: ApiProcess, receiver: Receiver
) -> None:
    hooked.add_tenant("picky")
    port = receiver.server.server_address[1]
    with hooked.client("picky") as http:
        for url in (
            f"http://localhost:{port}/hook",  # loopback, not named by the operator
            "http://169.254.169.254/latest/meta-data",  # the metadata address
            "http://10.0.0.1/hook",  # private
            "ftp://127.0.0.1/hook",  # not http(s)
            f"http://user:pw@127.0.0.1:{port}/hook",  # credentials in the URL
        ):
            response = http.post(
                "/v1/runs",
                json={
                    "harness": "stdio-json",
                    "executable": DEMO,
                    "input": "x",
                    "webhook_url": url,
                },
            )
            assert response.status_code == 400, (url, response.text)
            assert "webhook_url refused" in response.json()["error"]["message"]
    assert receiver.got == []


def _tenants(server: ApiProcess) -> list[dict[str, Any]]:
    data = json.loads(server.tenants_file.read_text())["tenants"]
    return [{"name": name, **body} for name, body in data.items()]
