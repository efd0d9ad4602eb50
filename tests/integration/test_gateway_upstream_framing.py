"""The model gateway against an upstream that frames its answers every way HTTP/1.1 allows
(worker/gateway/h1client.py, body.py): kept-alive connections reused, a chunked body in many
chunks with extensions and a trailer, a body read until the upstream closes, no body at all,
and an upstream that breaks off mid-body. Real sockets: a raw upstream here, a turn's route
on this host's loopback, httpx as the harness.
"""

from __future__ import annotations

import asyncio
import os
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from adapters.events import Event, Usage
from tests.fakemodel import FakeModelServer
from tests.integration.model_routes import REAL, route_to
from worker.gateway import h1client
from worker.gateway.route import ModelRoute
from worker.gateway.upstream_client import HttpxClient, upstream_client

SSE = b"content-type: text/event-stream\r\n"
USAGE_FRAME = (
    b'data: {"model":"m-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n'
)


def _chunk(data: bytes, extension: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), extension, data)


ANSWERS: dict[bytes, list[bytes]] = {
    # Each a list of writes; "close" after the last one when the name says so.
    b"keep": [b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n'
              b'{"ok":true}'],
    b"chunks": [
        b"HTTP/1.1 200 OK\r\n" + SSE + b"transfer-encoding: chunked\r\n\r\n",
        _chunk(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b";name=value"),
        _chunk(USAGE_FRAME[:7]) + _chunk(USAGE_FRAME[7:40]),
        _chunk(USAGE_FRAME[40:]) + _chunk(b"data: [DONE]\n\n"),
        b"0\r\nx-checksum: 1\r\n\r\n",
    ],
    b"until-close": [b"HTTP/1.1 200 OK\r\n" + SSE + b"connection: close\r\n\r\n",
                     USAGE_FRAME, b"data: [DONE]\n\n"],
    b"no-content": [b"HTTP/1.1 204 No Content\r\n\r\n"],
    b"broken-chunks": [b"HTTP/1.1 200 OK\r\n" + SSE + b"transfer-encoding: chunked\r\n\r\n",
                       _chunk(USAGE_FRAME)],
    b"broken-length": [b"HTTP/1.1 200 OK\r\n" + SSE + b"content-length: 1000\r\n\r\n",
                       USAGE_FRAME],
    b"keep-then-close": [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"],
}  # fmt: skip
CLOSES = {b"until-close", b"broken-chunks", b"broken-length"}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.keys: list[bytes] = []


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.connections += 1
        while line := self.rfile.readline():
            headers: dict[bytes, bytes] = {}
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.partition(b":")
                headers[name.strip().lower()] = value.strip()
            assert line.startswith(b"POST ") and headers[b"host"]
            self.rfile.read(int(headers.get(b"content-length", b"0")))
            self.server.keys.append(headers.get(b"authorization", b""))
            name = headers[b"x-answer"]
            for write in ANSWERS[name]:
                self.wfile.write(write)
                self.wfile.flush()
                time.sleep(0.02)  # each write its own read at the gateway
            if name == b"keep-then-close":
                time.sleep(0.2)
                return
            if name in CLOSES:
                return


@dataclass
class Turn:
    route: ModelRoute
    standin: str
    server: _Server
    harness: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))
    seen: list[Event] = field(default_factory=list)

    def post(self, answer: str) -> httpx.Response:
        return self.harness.post(
            self.route.base_url + "/chat/completions",
            json={"model": "m", "stream": True, "stream_options": {"include_usage": True}},
            headers={"authorization": f"Bearer {self.standin}", "x-answer": answer},
        )

    def usages(self) -> list[Usage]:
        self.seen += self.route.drain()
        return [e for e in self.seen if isinstance(e, Usage)]


@pytest.fixture
def turn() -> Iterator[Turn]:
    server = _Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    route, standin = route_to(f"http://{host!s}:{port}/v1")
    opened = Turn(route, standin, server)
    yield opened
    opened.harness.close()
    route.close()
    server.shutdown()
    server.server_close()


def test_kept_alive_connections_carry_the_next_requests(turn: Turn) -> None:
    for _ in range(3):
        answer = turn.post("keep")
        assert answer.status_code == 200 and answer.json() == {"ok": True}
    assert turn.server.connections == 1
    assert turn.server.keys == [f"Bearer {REAL}".encode()] * 3


def test_a_body_in_many_chunks_with_extensions_and_a_trailer_arrives_whole(turn: Turn) -> None:
    answer = turn.post("chunks")
    assert answer.status_code == 200
    assert answer.content == (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n' + USAGE_FRAME + b"data: [DONE]\n\n"
    )
    (usage,) = turn.usages()
    assert (usage.input_tokens, usage.output_tokens, usage.model) == (3, 5, "m-1")
    assert turn.post("keep").status_code == 200
    assert turn.server.connections == 1  # the chunked body ended where it said: kept


def test_a_body_that_ends_when_the_upstream_closes_arrives_whole(turn: Turn) -> None:
    answer = turn.post("until-close")
    assert answer.status_code == 200
    assert answer.content == USAGE_FRAME + b"data: [DONE]\n\n"
    assert [u.output_tokens for u in turn.usages()] == [5]
    assert turn.post("keep").status_code == 200
    assert turn.server.connections == 2  # that connection ended with its body


def test_an_answer_without_a_body_keeps_its_connection(turn: Turn) -> None:
    assert turn.post("no-content").status_code == 204
    assert turn.post("keep").status_code == 200
    assert turn.server.connections == 1


@pytest.mark.parametrize("answer", ["broken-chunks", "broken-length"])
def test_an_upstream_that_breaks_off_mid_body_leaves_the_harness_a_broken_answer(
    turn: Turn, answer: str
) -> None:
    """The harness sees its response cut short (never a made-up end), what came is metered
    once, and the next request gets a connection of its own."""
    with pytest.raises(httpx.RemoteProtocolError):
        turn.post(answer)
    assert [u.output_tokens for u in turn.usages()] == [5]
    turn.harness.close()
    turn.harness = httpx.Client(timeout=30)
    assert turn.post("keep").status_code == 200
    assert turn.server.connections == 2


def test_an_idle_connection_the_upstream_closed_is_not_used_again(turn: Turn) -> None:
    assert turn.post("keep-then-close").status_code == 200
    time.sleep(0.5)  # the upstream has closed it meanwhile
    assert turn.post("keep").status_code == 200
    assert turn.server.connections == 2


def test_behind_the_environments_proxy_httpx_carries_the_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker with proxy variables gets httpx's client (which honours them; here the
    upstream is exempt by NO_PROXY, so it is reached straight), behind the same interface."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    for name in ("http_proxy", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(upstream_client({}, None), HttpxClient)
    assert os.environ["HTTP_PROXY"]
    with FakeModelServer() as fake:
        route, standin = route_to(fake.url + "/v1", client=upstream_client({}, None))
        try:
            for stream in (False, True):
                answer = httpx.post(
                    route.base_url + "/chat/completions",
                    json={"model": "fake-model", "stream": stream,
                          "messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": f"Bearer {standin}"},
                    timeout=30,
                )  # fmt: skip
                assert answer.status_code == 200, answer.text
            usages = [e for e in route.drain() if isinstance(e, Usage)]
        finally:
            route.close()
        assert [r.credentials for r in fake.model_requests()] == [(REAL,), (REAL,)]
        assert len(usages) == 2 and all(u.output_tokens > 0 for u in usages)


def _started() -> _Server:
    server = _Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_pool_keeps_few_connections_and_none_for_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most MAX_IDLE idle (the longest idle closed first), none past IDLE_S."""
    monkeypatch.setattr(h1client, "MAX_IDLE", 2)
    monkeypatch.setattr(h1client, "IDLE_S", 0.3)
    servers = [_started() for _ in range(3)]
    client = h1client.H1Client({}, ssl.create_default_context())

    async def ask(server: _Server) -> None:
        host, port = server.server_address[:2]
        response = await client.send(
            b"POST", f"http://{host!s}:{port}/v1/x", [(b"x-answer", b"keep")], b"{}"
        )
        while await response.read():
            pass
        await response.aclose()

    async def scenario() -> list[int]:
        for server in servers:  # three idle: the first one's closed
            await ask(server)
        await ask(servers[1])  # kept: reused
        await ask(servers[0])  # closed: a new one
        await asyncio.sleep(0.4)
        await ask(servers[1])  # idle too long: a new one
        return [server.connections for server in servers]

    try:
        assert asyncio.run(scenario()) == [2, 2, 1]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
