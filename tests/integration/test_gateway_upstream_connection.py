"""The model gateway's connections to its upstream (worker/gateway/h1client.py, network.py):
HTTPS to a pinned name with the operator's CA, a certificate nobody trusts refused, and a
stream nobody reads held in a bounded buffer. Real sockets, real TLS, the fake model server.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters.events import Usage
from tests.fakemodel import FakeModelServer, tls
from tests.integration.model_routes import REAL, route_to
from worker.gateway import network
from worker.gateway.route import ModelRoute

NAME = "models.gateway-test.invalid"
"""A name no resolver knows: only the pin reaches it."""


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tls.TestCA:
    return tls.make_test_ca(tmp_path_factory.mktemp("gateway-tls"), (NAME,))


@pytest.fixture
def https_fake(ca: tls.TestCA) -> Iterator[FakeModelServer]:
    with FakeModelServer(tls=ca.server_context(), name=NAME) as server:
        yield server


def _route(fake: FakeModelServer, ca_file: Path | None) -> tuple[ModelRoute, str]:
    return route_to(
        fake.url + "/v1", pins={NAME: "127.0.0.1"}, ca_file=str(ca_file) if ca_file else None
    )


def _chat(stream: bool) -> dict[str, object]:
    return {
        "model": "fake-model",
        "stream": stream,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}],
    }


def test_an_https_upstream_at_a_pinned_name_with_the_operators_ca(
    https_fake: FakeModelServer, ca: tls.TestCA
) -> None:
    route, standin = _route(https_fake, ca.ca_pem)
    try:
        for stream in (False, True, False):  # the second and third reuse the connection
            answer = httpx.post(
                route.base_url + "/chat/completions",
                json=_chat(stream),
                headers={"authorization": f"Bearer {standin}"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            if stream:
                assert answer.text.rstrip().endswith("data: [DONE]")
        events = route.drain()
    finally:
        route.close()
    requests = https_fake.model_requests()
    assert len(requests) == 3 and all(r.credentials == (REAL,) for r in requests)
    usages = [e for e in events if isinstance(e, Usage)]
    assert len(usages) == 3 and all(u.output_tokens > 0 for u in usages)


def test_an_upstream_certificate_nobody_trusts_is_not_an_answer(
    https_fake: FakeModelServer,
) -> None:
    route, standin = _route(https_fake, None)  # the test CA not named: the system's only
    try:
        answer = httpx.post(
            route.base_url + "/chat/completions",
            json=_chat(False),
            headers={"authorization": f"Bearer {standin}"},
            timeout=30,
        )
    finally:
        route.close()
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_unreachable"
    assert https_fake.model_requests() == []


def test_a_stream_nobody_reads_is_held_in_a_bounded_buffer() -> None:
    """The upstream sends far more than the buffer; the connection's reader takes nothing
    for a while: what the gateway holds stays bounded (the rest waits in the kernel), and
    every byte arrives, in order, once read."""
    total = 32 * 1024 * 1024
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def send() -> None:
        conn, _ = listener.accept()
        with conn:
            block = bytes(range(256)) * 256
            for _ in range(total // len(block)):
                conn.sendall(block)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()

    async def read() -> tuple[int, int]:
        stream = await network.connect("127.0.0.1", port, pins={}, timeout=5)
        first = await stream.read(65536, timeout=5)
        await asyncio.sleep(0.5)  # the reader stalls; the upstream does not
        held = stream._protocol.size
        got, expected_byte = len(first), len(first) % 256
        while chunk := await stream.read(65536, timeout=5):
            assert chunk[0] == expected_byte  # in order, nothing lost
            got += len(chunk)
            expected_byte = got % 256
        stream.close()
        return held, got

    started = time.monotonic()
    held, got = asyncio.run(read())
    sender.join(10)
    listener.close()
    assert got == total
    assert held <= network.HIGH_WATER + network.READ_BYTES, held
    assert time.monotonic() - started < 30


def test_a_read_waits_as_long_as_bytes_keep_coming_and_no_longer() -> None:
    """One timer per connection, moved on by each wait: a trickle never times out, silence
    does, on time."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            for _ in range(8):
                conn.sendall(b"x")
                time.sleep(0.1)
            time.sleep(3)

    threading.Thread(target=trickle, daemon=True).start()

    async def read() -> tuple[int, float, str]:
        stream = await network.connect("127.0.0.1", port, pins={}, timeout=5)
        started, got = time.monotonic(), 0
        try:
            while data := await stream.read(65536, timeout=0.3):
                got += len(data)
            why = "the end"
        except network.UpstreamFailed as exc:
            why = str(exc)
        finally:
            stream.close()
        return got, time.monotonic() - started, why

    got, seconds, why = asyncio.run(read())
    listener.close()
    assert got == 8 and "nothing received in 0.3 s" in why
    assert 0.9 < seconds < 2.0  # the last byte at ~0.7 s, silence for 0.3 s
