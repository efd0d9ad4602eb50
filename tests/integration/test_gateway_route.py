"""The model gateway's route against the fake model server as the upstream: real sockets, real
HTTP both ways, the route's decisions and what it tells the turn.

Each test opens one turn's route on this host's loopback (as for the local sandbox) with one
stand-in for a real key, and sends it what a CLI would send."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from adapters.events import Event, SandboxActivity, SessionError, Usage, session_error
from tests.fakemodel import FakeModelServer
from tests.integration.model_routes import REAL, route_to
from worker.gateway.proxy import Policy
from worker.gateway.route import ModelRoute
from worker.gateway.standins import StandIns
from worker.gateway.upstreams import Upstream


@dataclass
class Turn:
    route: ModelRoute
    standin: str
    fake: FakeModelServer
    standing: bool = True
    budget: SessionError | None = None
    seen: list[Event] = field(default_factory=list)

    def post(self, path: str, body: dict[str, object], **headers: str) -> httpx.Response:
        sent = {"authorization": f"Bearer {self.standin}", **headers}
        return httpx.post(self.route.base_url + path, json=body, headers=sent, timeout=30)

    def events(self) -> list[Event]:
        self.seen += self.route.drain()
        return self.seen


def chat(model: str = "fake-model", text: str = "hello", stream: bool = False) -> dict[str, object]:
    return {
        "model": model,
        "stream": stream,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": text}],
    }


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def open_turn(fake: FakeModelServer, **policy: object) -> Turn:
    standins = StandIns.issue({"OPENAI_API_KEY": REAL})
    turn: Turn
    route = ModelRoute(
        Policy(
            upstream=Upstream.parse(fake.url + "/v1", "base-url"),
            standins=standins,
            request_max_bytes=int(policy.pop("request_max_bytes", 1 << 20)),  # type: ignore[call-overload]
            **policy,  # type: ignore[arg-type]
        ),
        run_id="r-test",
        alive=lambda: turn.standing,
        over_budget=lambda wire: turn.budget,
        relay_port=0,
    )
    route.open_loopback()
    turn = Turn(route, standins.by_name["OPENAI_API_KEY"], fake)
    return turn


@pytest.fixture
def turn(fake: FakeModelServer) -> Iterator[Turn]:
    opened = open_turn(fake)
    yield opened
    opened.route.close()


def test_the_upstream_sees_the_real_key_and_never_the_stand_in(turn: Turn) -> None:
    answer = turn.post("/chat/completions", chat())
    assert answer.status_code == 200, answer.text
    (request,) = turn.fake.model_requests()
    assert request.credentials == (REAL,)
    assert turn.standin not in json.dumps(request.as_dict())
    assert turn.standin.startswith("hwgw_") and REAL not in turn.standin


def test_a_key_in_the_query_or_another_header_is_swapped_too(turn: Turn) -> None:
    path = "/models/gemini-2.5-flash:generateContent"
    answer = httpx.post(
        f"{turn.route.base_url}{path}?key={turn.standin}",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": turn.standin},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    (request,) = turn.fake.model_requests()
    assert request.credentials == (REAL, REAL)


def test_usage_and_the_served_model_come_from_the_wire(turn: Turn) -> None:
    turn.fake.answer_model = "fake-model-2026-01"
    for stream in (False, True):
        assert turn.post("/chat/completions", chat(stream=stream)).status_code == 200
    usages = [e for e in turn.events() if isinstance(e, Usage)]
    assert len(usages) == 2
    for usage in usages:
        assert usage.source == "gateway" and usage.model == "fake-model-2026-01"
        assert usage.input_tokens > 0 and usage.output_tokens > 0
    totals = turn.route.totals
    assert totals.requests == 2 and totals.served_model == "fake-model-2026-01"
    assert totals.input_tokens == sum(u.input_tokens for u in usages)


def test_a_request_without_the_turns_stand_in_goes_nowhere(turn: Turn) -> None:
    other = StandIns.issue({"OPENAI_API_KEY": "another"}).by_name["OPENAI_API_KEY"]
    for key in (other, REAL, "sk-anything"):
        answer = httpx.post(
            turn.route.base_url + "/chat/completions",
            json=chat(),
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 401, answer.text
        assert "harness-worker model gateway" in answer.json()["error"]["message"]
    assert turn.fake.requests == []
    refused = [e for e in turn.events() if isinstance(e, SandboxActivity)]
    assert len(refused) == 3 and all(e.kind == "model" for e in refused)


def test_a_target_outside_the_runs_upstream_is_refused(turn: Turn) -> None:
    for path in ("/../admin", "/%2e%2e/x"):
        answer = httpx.post(
            f"http://127.0.0.1:{turn.route.port}{path}",
            json=chat(),
            headers={"authorization": f"Bearer {turn.standin}"},
            timeout=30,
        )
        assert answer.status_code in (400, 404), (path, answer.status_code)
    raw = socket.create_connection(("127.0.0.1", turn.route.port))
    raw.sendall(
        b"GET http://169.254.169.254/latest HTTP/1.1\r\nhost: x\r\n"
        + f"authorization: Bearer {turn.standin}\r\n\r\n".encode()
    )
    assert raw.recv(100).startswith(b"HTTP/1.1 404")
    raw.close()
    assert turn.fake.requests == []


def test_a_body_over_the_limit_is_refused_and_nothing_sent(fake: FakeModelServer) -> None:
    small = open_turn(fake, request_max_bytes=10_000)
    try:
        answer = small.post("/chat/completions", chat(text="x" * 20_000))
        assert answer.status_code == 413
        assert "HARNESS_MODEL_REQUEST_MAX_BYTES" in answer.text
        assert fake.requests == []
    finally:
        small.route.close()


def test_after_the_run_ends_the_stand_in_is_refused_and_after_the_turn_nothing_listens(
    turn: Turn,
) -> None:
    assert turn.post("/chat/completions", chat()).status_code == 200
    turn.standing = False
    turn.route._checked = 0.0  # the next drain asks at once (a second at most otherwise)
    turn.events()
    answer = turn.post("/chat/completions", chat())
    assert answer.status_code == 401 and "ended" in answer.text
    turn.route.close()
    with pytest.raises(httpx.ConnectError):
        turn.post("/chat/completions", chat())
    assert len(turn.fake.model_requests()) == 1


def test_a_spent_budget_refuses_the_next_request_and_halts_the_turn(turn: Turn) -> None:
    assert turn.post("/chat/completions", chat()).status_code == 200
    turn.budget = session_error("the run's budget is spent at the model gateway", "budget")
    answer = turn.post("/chat/completions", chat())
    assert answer.status_code == 400
    assert "budget" in answer.json()["error"]["message"]
    assert turn.route.halt is not None and turn.route.halt.reason == "budget"
    assert len(turn.fake.model_requests()) == 1


def test_a_rate_limit_halts_the_turn_with_the_upstreams_retry_after(turn: Turn) -> None:
    turn.fake.set_scenario("http-429")
    answer = turn.post("/chat/completions", chat())
    assert answer.status_code == 429  # the harness sees what the API said
    halt = turn.route.halt
    assert halt is not None and halt.reason == "rate-limited" and halt.retry_after_s == 7
    # The harness's own retry goes no further: the turn is being stopped.
    again = turn.post("/chat/completions", chat())
    assert again.status_code == 429 and "the turn is stopped" in again.text
    assert len(turn.fake.model_requests()) == 1


def test_a_failing_model_falls_back_to_the_next_and_says_which_served(
    fake: FakeModelServer,
) -> None:
    fake.failing_models = {"primary"}
    turn = open_turn(fake, fallback_models=("secondary", "tertiary"))
    try:
        for stream in (False, True):
            answer = turn.post("/chat/completions", chat(model="primary", stream=stream))
            assert answer.status_code == 200, answer.text
    finally:
        turn.route.close()
    asked = [(r.requested_model, r.status) for r in fake.model_requests()]
    assert asked == [("primary", 529), ("secondary", 200)] * 2
    assert all(r.credentials == (REAL,) for r in fake.model_requests())
    said = [e.description for e in turn.events() if isinstance(e, SandboxActivity)]
    assert said[:2] == [
        "model fallback: primary answered 529; asking secondary",
        "model fallback: secondary served the request for primary",
    ]
    assert [e.model for e in turn.seen if isinstance(e, Usage)] == ["secondary", "secondary"]


def test_an_overloaded_model_with_no_fallback_left_halts_the_turn_rate_limited(
    fake: FakeModelServer,
) -> None:
    fake.failing_models = {"primary", "secondary"}
    turn = open_turn(fake, fallback_models=("secondary",))
    try:
        assert turn.post("/chat/completions", chat(model="primary")).status_code == 529
    finally:
        turn.route.close()
    assert [r.requested_model for r in fake.model_requests()] == ["primary", "secondary"]
    halt = turn.route.halt
    assert halt is not None and halt.reason == "rate-limited" and halt.retryable


def test_a_429_is_not_a_fallback_unless_asked(fake: FakeModelServer) -> None:
    fake.set_scenario("http-429")
    turn = open_turn(fake, fallback_models=("secondary",))
    try:
        assert turn.post("/chat/completions", chat(model="primary")).status_code == 429
    finally:
        turn.route.close()
    assert [r.requested_model for r in fake.model_requests()] == ["primary"]


def test_a_streamed_answer_passes_through_as_it_arrives(fake: FakeModelServer) -> None:
    fake.set_scenario("slow")
    fake.slow_delay = 0.3
    turn = open_turn(fake)
    try:
        started = time.monotonic()
        arrivals: list[float] = []
        with httpx.stream(
            "POST",
            turn.route.base_url + "/chat/completions",
            json=chat(stream=True),
            headers={"authorization": f"Bearer {turn.standin}"},
            timeout=30,
        ) as response:
            for _ in response.iter_raw():
                arrivals.append(time.monotonic() - started)
    finally:
        turn.route.close()
    # The first frames arrive long before the last: nothing waits for the body's end.
    assert len(arrivals) >= 3
    assert arrivals[0] < arrivals[-1] - 0.5


def test_a_streamed_chat_completion_is_asked_for_its_usage(turn: Turn) -> None:
    body = chat(stream=True)
    del body["stream_options"]
    assert turn.post("/chat/completions", body).status_code == 200
    (request,) = turn.fake.model_requests()
    assert request.body["stream_options"] == {"include_usage": True}
    (usage,) = [e for e in turn.events() if isinstance(e, Usage)]
    assert usage.output_tokens > 0


class _Echoing(http.server.BaseHTTPRequestHandler):
    """An upstream that quotes the key it was given: in a header, and in a chunked body split
    across chunks (an error page, a debugging proxy)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        key = (self.headers.get("authorization") or "").removeprefix("Bearer ").encode()
        body = b'{"error": {"message": "invalid key ' + key + b'"}}'
        cut = body.index(key) + len(key) // 2
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("x-seen-key", key.decode())
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for part in (body[:cut], body[cut:]):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def test_an_upstream_that_quotes_the_real_key_never_shows_it_to_the_harness() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echoing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    route, standin = route_to(f"http://127.0.0.1:{server.server_port}/v1")
    try:
        answer = httpx.post(
            route.base_url + "/chat/completions",
            json=chat(),
            headers={"authorization": f"Bearer {standin}"},
            timeout=30,
        )
    finally:
        route.close()
        server.shutdown()
    assert answer.status_code == 401
    seen = answer.text + json.dumps(dict(answer.headers))
    assert REAL not in seen and REAL[: len(REAL) // 2] not in seen
    assert "*" * len(REAL) in answer.text and answer.headers["x-seen-key"] == "*" * len(REAL)


def test_a_turn_cannot_hold_more_connections_than_its_limit(fake: FakeModelServer) -> None:
    """An agent that opens connections and never sends: past the limit each is answered 503
    and closed, so the worker's descriptors (shared by its other turns) stay bounded; one
    that ends frees its place."""
    turn = open_turn(fake, max_connections=4)
    assert turn.route.port is not None
    held = [socket.create_connection(("127.0.0.1", turn.route.port)) for _ in range(4)]
    try:
        time.sleep(0.3)  # the four are being served (waiting for their requests)
        extra = socket.create_connection(("127.0.0.1", turn.route.port))
        extra.settimeout(5)
        answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"HARNESS_MODEL_MAX_CONNECTIONS" in answer
        assert extra.recv(4096) == b""  # closed
        held.pop().close()
        time.sleep(0.3)
        assert turn.post("/chat/completions", chat()).status_code == 200
    finally:
        for sock in held:
            sock.close()
        turn.route.close()
