"""The five real CLIs with network ``egress``: the model over HTTPS through the model gateway (not the egress proxy), and a
tool call that tries a server the run may not reach (by name, by raw IP through the proxy, by
raw IP directly, DNS to another resolver). Each attempt fails at once and is reported in the
stream as a ``network`` activity; the turn still ends with exactly one terminal event, and the
forbidden server never sees a connection.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import (
    FORBIDDEN_NAME,
    HARNESSES,
    MODEL_NAME,
    TEST_HOST,
    Deployment,
    Harness,
    nonce,
)
from tests.fakemodel.clis import FAKE_KEY
from tests.fakemodel.scenarios import FORBIDDEN_DONE
from tests.helpers import assert_one_terminal

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.docker,
    pytest.mark.redis,
    pytest.mark.celery,
]

ALL = pytest.mark.parametrize("harness", list(HARNESSES.values()), ids=list(HARNESSES))


@ALL
def test_egress_turn_reaches_the_model_over_tls_and_nothing_else(
    e2e: Deployment, harness: Harness
) -> None:
    assert e2e.forbidden is not None
    assert e2e.base_url().startswith(f"https://{MODEL_NAME}:")
    before = e2e.forbidden.connections
    tag = nonce()
    started = time.monotonic()
    followed = e2e.run(
        harness, f"[scenario:forbidden] try the other server {tag}", "--posture", "dangerous"
    )
    elapsed = time.monotonic() - started
    events = followed.events
    assert_one_terminal(events, 1)
    assert followed.terminal["type"] == "turn-complete", followed.describe()
    # The tool ran to its end, and its result reached the model through the gateway.
    calls = e2e.requests(tag)
    results = calls[-1].conversation.tool_results() if calls[-1].conversation else []
    assert len(calls) >= 2 and results and FORBIDDEN_DONE in results[-1], followed.describe()

    denied = [e for e in followed.of_type("sandbox-activity") if e["kind"] == "network"]
    assert all(d["denied"] is True for d in denied), followed.describe()
    seen = {(d["host"], d["port"]) for d in denied}
    port = e2e.forbidden.port
    assert (FORBIDDEN_NAME, port) in seen, followed.describe()  # by name, through the proxy
    assert (TEST_HOST, port) in seen, followed.describe()  # raw IP: proxy and direct
    assert any("direct tcp" in d["description"] for d in denied), followed.describe()
    assert (TEST_HOST, 53) in seen, followed.describe()  # DNS to another resolver
    # Denials come after the work, before the terminal event.
    last_denial = max(i for i, e in enumerate(events) if e["type"] == "sandbox-activity")
    assert last_denial == len(events) - 2 or events[-2]["type"] != "sandbox-activity"
    assert e2e.forbidden.connections == before
    # Every attempt failed fast: the whole turn (two model calls, four attempts) is quick.
    assert elapsed < 60, followed.describe()

    # The model traffic went through the model gateway (the relay on the container's own
    # loopback, the key swapped in the worker), not the egress proxy: no tunnel from this run's
    # address to the model, and every model call carried the real key.
    assert all(set(c.credentials) == {FAKE_KEY} for c in calls), [c.credentials for c in calls]
    address = e2e.container(followed.run_id).attrs["NetworkSettings"]["Networks"]
    (inside,) = [n["IPAddress"] for name, n in address.items() if name.startswith("harness-egress")]
    gateway = e2e.docker.containers.get(f"harness-egress-gateway-{e2e.env.prefix}")
    tunnels = [
        line
        for line in gateway.logs(stderr=False).decode().splitlines()
        if f" {inside} CONNECT {MODEL_NAME}:{e2e.fake.port} " in line and "TCP_TUNNEL" in line
    ]
    assert tunnels == [], tunnels
    print(f"\n{harness.id}: {followed.describe()}")  # the closing note's evidence (-s)

    status = e2e.client.status(followed.run_id)
    assert status["network"] == "egress"
    assert status["egress_allow"] and f"{MODEL_NAME}:{e2e.fake.port}" in status["egress_allow"]
