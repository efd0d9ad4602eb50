"""A spent token budget stops the next model request however soon the harness sends it.

A CLI may send a model request while the gateway still relays an earlier response of its turn,
on a connection of its own: a side call beside its turn (opencode asks for a title at once),
or its next call the moment it reads the stream's last frame (``data: [DONE]``, Anthropic's
``message_stop``), which the gateway relays before it has read the body's end. The earlier
response spends the budget: the request is refused at the gateway and never reaches the
upstream. Without a token budget nothing is held.

The upstream here streams as the fake model server does, in separate writes, with a pause
before the frame with the usage and another before the chunked end. Real sockets: a raw
upstream, a turn's route on this host's loopback, httpx as the harness.
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from adapters.events import SessionError, session_error
from worker.gateway.proxy import Policy
from worker.gateway.route import ModelRoute, WireTotals
from worker.gateway.standins import StandIns
from worker.gateway.upstreams import Upstream

REAL = "sk-real"
"""Shorter than the echo mask's minimum: nothing of the body is held back at a piece's end,
so the last frame reaches the harness before the body's end does (a longer key would hold the
frame's last bytes back until then)."""
BUDGET = 8
"""Tokens the run may spend: each answer below reports 3 in and 5 out, so one spends it."""
PAUSE_S = 0.4
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CHAT = "/v1/chat/completions"
STREAMS = {
    # The first frame, the one with the usage and the last, each after a pause.
    CHAT: [
        b'data: {"model":"m-1","choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"model":"m-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}'
        b"\n\ndata: [DONE]\n\n",
    ],
    "/v1/messages": [
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"m-1",'
        b'"usage":{"input_tokens":3,"output_tokens":1}}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"end_turn"},"usage":{"output_tokens":5}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ],
}
LAST = {CHAT: "data: [DONE]", "/v1/messages": 'data: {"type":"message_stop"}'}
BODY = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[str] = []


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        while line := self.rfile.readline():
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            self.rfile.read(length)
            path = line.split()[1].decode()
            self.server.requests.append(path)
            first, last = STREAMS[path]
            for write in (HEAD + _chunk(first), _chunk(last), b"0\r\n\r\n"):
                self.wfile.write(write)
                self.wfile.flush()
                if write != b"0\r\n\r\n":
                    time.sleep(PAUSE_S)


@dataclass
class Turn:
    route: ModelRoute
    standin: str
    server: _Server
    harness: httpx.Client

    def url(self, path: str) -> str:
        return str(self.route.base_url).removesuffix("/v1") + path

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.standin}", "x-api-key": self.standin}

    def post(self, path: str) -> httpx.Response:
        return self.harness.post(self.url(path), json=BODY, headers=self.headers)


def over_budget(wire: WireTotals) -> SessionError | None:
    if wire.tokens >= BUDGET:
        return session_error(f"the run's budget of {BUDGET} tokens is spent", "budget")
    return None


def open_turn(budgeted: bool) -> Iterator[Turn]:
    server = _Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    standins = StandIns.issue({"ANTHROPIC_API_KEY": REAL})
    host, port = server.server_address[:2]
    route = ModelRoute(
        Policy(
            upstream=Upstream.parse(f"http://{host!s}:{port}/v1", "base-url"),
            standins=standins,
            request_max_bytes=1 << 20,
            budgeted=budgeted,
        ),
        run_id="r-test",
        alive=lambda: True,
        over_budget=over_budget,
        relay_port=0,
    )
    route.open_loopback()
    with httpx.Client(timeout=30) as harness:
        yield Turn(route, standins.by_name["ANTHROPIC_API_KEY"], server, harness)
    route.close()
    server.shutdown()
    server.server_close()


@pytest.fixture
def turn() -> Iterator[Turn]:
    yield from open_turn(budgeted=True)


@pytest.fixture
def unbudgeted() -> Iterator[Turn]:
    yield from open_turn(budgeted=False)


def check_refused(turn: Turn, second: httpx.Response, path: str) -> None:
    assert second.status_code == 400, second.text
    assert second.json()["error"]["code"] == "budget_exceeded"
    assert turn.server.requests == [path]
    assert turn.route.halt is not None and turn.route.halt.reason == "budget"
    assert turn.route.totals.tokens == BUDGET and turn.route.totals.requests == 1


def test_a_request_beside_one_in_flight_waits_for_its_count_and_is_refused(turn: Turn) -> None:
    with turn.harness.stream("POST", turn.url(CHAT), json=BODY, headers=turn.headers) as first:
        lines = first.iter_lines()
        assert next(lines).startswith("data: ")  # the first frame: no usage yet
        started = time.monotonic()
        second = turn.post(CHAT)
        # It waited for the first response's end (its count), which came after two pauses.
        assert time.monotonic() - started > PAUSE_S
        assert LAST[CHAT] in list(lines)
    check_refused(turn, second, CHAT)


@pytest.mark.parametrize("path", list(STREAMS), ids=["chat", "anthropic"])
def test_a_request_sent_on_the_last_frame_of_the_spending_answer_is_refused(
    turn: Turn, path: str
) -> None:
    with turn.harness.stream("POST", turn.url(path), json=BODY, headers=turn.headers) as first:
        lines = first.iter_lines()
        for line in lines:
            if line == LAST[path]:
                break
        else:
            pytest.fail("the stream ended without its last frame")
        # The body's end is a pause away: the next request goes on a connection of its own.
        second = turn.post(path)
        assert [line for line in lines if line] == []
    check_refused(turn, second, path)


def test_without_a_token_budget_a_request_beside_one_in_flight_goes_at_once(
    unbudgeted: Turn,
) -> None:
    turn = unbudgeted
    with turn.harness.stream("POST", turn.url(CHAT), json=BODY, headers=turn.headers) as first:
        lines = first.iter_lines()
        assert next(lines).startswith("data: ")
        with turn.harness.stream("POST", turn.url(CHAT), json=BODY, headers=turn.headers) as second:
            assert second.status_code == 200
            assert turn.server.requests == [CHAT, CHAT]  # the first not counted yet
            assert turn.route.totals.requests == 0
            second.read()
        assert LAST[CHAT] in list(lines)
    assert turn.route.totals.requests == 2
