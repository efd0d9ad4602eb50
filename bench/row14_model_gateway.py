"""Row 14: the model gateway (worker/gateway). Each figure is a request or a stream through a
turn's route against the same request sent to the same upstream directly, in the same run:

1. a small non-streamed chat completion, sequential over a keep-alive connection: the
   latency the gateway adds, per percentile (gateway - direct);
2. a streamed chat completion whose first token comes after :data:`FIRST_TOKEN_S` and whose
   frames then come as fast as the upstream can send them: time to first byte, tokens/s;
3. a 100 MiB stream (its reader pausing a while, so that nothing drains the gateway): the
   gateway process's resident memory, peak over before, against a bare reader's;
4. 64 runs streaming at once through one gateway (64 routes, a stand-in each): the wall
   clock against the same 64 streams read from the upstream directly; streams paced like a
   model's (a frame every :data:`PACED_GAP_S`), then as fast as the upstream sends;
5. with Docker: the request of 1 from a container on network ``none`` through the relay
   (worker/gateway/relay.py) and the route's socket, against a container on ``bridge``.

Every party has a process of its own, so that none shares an interpreter lock with another:
the upstream (an asyncio server in this module, :class:`FakeUpstream`), the gateway (this
module's ``gateway`` command: routes opened as a worker opens them, on the worker's shared
gateway loop) and each client (its ``client`` command, or :data:`CONTAINER_CLIENT` in a
container). ``python -m bench.row14_model_gateway upstream|gateway|client ...`` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bench.proc_status import memory_bytes
from bench.stats import mib, p50, percentile
from bench.table import Figure, RowResult

if TYPE_CHECKING:
    from bench.context import Bench

ROOT = Path(__file__).resolve().parent.parent
REAL_KEY = "sk-bench-upstream-key-0123456789abcdef"
"""The key the upstream accepts; the routes hold it, the clients through them a stand-in."""
DOCKER_HOST = "172.17.0.1"
"""docker0's address: where a container on ``bridge`` reaches this host."""
CONTAINER_DIR = "/endpoint"
RELAY_PORT = 47311

FIRST_TOKEN_S = 0.1
"""The upstream's wait before a stream's first frame (a fast model's first token)."""
PACED_GAP_S = 0.01
"""Between frames of a paced stream: 100 tokens/s, a fast model's pace."""
ADDED_P50_MS, ADDED_P99_MS = 1.0, 5.0
STREAM_SPEED = 0.95
RSS_LIMIT_MIB = 16.0
WALL_RATIO = 1.1
READ_BYTES = 65536

FRAME = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-model","choices":[{"index":0,"delta":{"content":"token "},'
    b'"finish_reason":null}]}\n\n'
)
"""One token's SSE frame, as Chat Completions streams it; every frame of a stream is this."""
BLOCK = FRAME * (READ_BYTES // len(FRAME))
"""What the upstream writes at once when it streams as fast as it can."""
ANSWER = "Hello from the bench upstream."
ANSWER_TOKENS, PROMPT_TOKENS = 7, 12


@dataclass(frozen=True)
class Sizes:
    requests: int
    """Target 1: requests each way (in ten blocks, alternating)."""
    streams: int
    """Target 2: streams each way."""
    stream_bytes: int
    memory_bytes: int
    """Target 3: the one big stream."""
    runs: int
    """Target 4: routes, and streams at once."""
    paced_frames: int
    burst_bytes: int
    """Target 4, unpaced: each run's stream."""
    bursts: int
    container_requests: int


SIZES = {
    "full": Sizes(1000, 20, 8 << 20, 100 << 20, 64, 100, 1 << 20, 3, 300),
    "quick": Sizes(300, 8, 8 << 20, 100 << 20, 64, 100, 1 << 20, 2, 100),
    "smoke": Sizes(30, 2, 1 << 20, 4 << 20, 8, 20, 256 << 10, 1, 20),
}


# -- what the upstream answers --------------------------------------------------------------


def frames_in(size: int) -> int:
    return max(1, size // len(FRAME))


def stream_tail(frames: int) -> bytes:
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": frames,
        "total_tokens": PROMPT_TOKENS + frames,
    }
    last = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "bench-model", "choices": [], "usage": usage}  # fmt: skip
    return b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n"


def stream_length(frames: int) -> int:
    """The body of a stream of ``frames`` tokens, as the client reads it (chunking undone)."""
    return frames * len(FRAME) + len(stream_tail(frames))


def completion() -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "bench-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ANSWER},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": ANSWER_TOKENS,
                "total_tokens": PROMPT_TOKENS + ANSWER_TOKENS,
            },
        }
    ).encode()


def chat_request(stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": "bench-model",
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": stream,
    }
    if stream:  # as the CLIs ask (the gateway would add it otherwise: the body left as sent)
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class FakeUpstream:
    """A Chat Completions upstream: a small completion, or a stream of ``x-bench-bytes`` of
    token frames (after ``x-bench-hold-s``; ``x-bench-gap-s`` apart, else in 64 KiB writes).
    Anything but the real key is answered 401, and a stand-in seen is counted."""

    def __init__(self) -> None:
        self.requests = self.refused = self.standins_seen = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers: dict[str, str] = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                self.requests += 1
                if b"hwgw_" in head or b"hwgw_" in body:
                    self.standins_seen += 1
                await self._answer(writer, headers, body)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # a kept-alive connection at the server's end
            pass
        finally:
            writer.close()

    async def _answer(
        self, writer: asyncio.StreamWriter, headers: dict[str, str], body: bytes
    ) -> None:
        if headers.get("authorization") != f"Bearer {REAL_KEY}":
            self.refused += 1
            data = b'{"error":{"message":"bad key"}}'
            writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
            await writer.drain()
            return
        if not json.loads(body).get("stream"):
            data = completion()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
            await writer.drain()
            return
        frames = frames_in(int(headers.get("x-bench-bytes") or 0))
        hold = float(headers.get("x-bench-hold-s") or 0)
        gap = float(headers.get("x-bench-gap-s") or 0)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")  # fmt: skip
        await writer.drain()
        if hold:
            await asyncio.sleep(hold)
        if gap:
            for index in range(frames):
                if index:
                    await asyncio.sleep(gap)
                writer.write(_chunk(FRAME))
                await writer.drain()
        else:
            per_block = len(BLOCK) // len(FRAME)
            full, rest = divmod(frames, per_block)
            block = _chunk(BLOCK)
            for _ in range(full):
                writer.write(block)
                await writer.drain()
            if rest:
                writer.write(_chunk(FRAME * rest))
        writer.write(_chunk(stream_tail(frames)) + b"0\r\n\r\n")
        await writer.drain()


async def _serve_upstream(host: str) -> None:
    upstream = FakeUpstream()
    server = await asyncio.start_server(upstream.serve, host, 0, backlog=256)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://{host}:{port}"}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    server.close()
    print(json.dumps(vars(upstream)), flush=True)


# -- the gateway: routes as a worker opens them ---------------------------------------------


def _serve_gateway(spec: dict[str, Any]) -> None:
    from adapters.events import Usage
    from worker.gateway.proxy import Policy
    from worker.gateway.route import ModelRoute
    from worker.gateway.standins import StandIns
    from worker.gateway.upstreams import Upstream

    routes: list[ModelRoute] = []
    keys: list[str] = []

    def route(url: str, relay_port: int = 0) -> ModelRoute:
        standins = StandIns.issue({"OPENAI_API_KEY": REAL_KEY})
        opened = ModelRoute(
            Policy(
                upstream=Upstream.parse(url + "/v1", "base-url"),
                standins=standins,
                request_max_bytes=1 << 20,
            ),
            run_id=f"bench-{len(routes)}",
            alive=lambda: True,
            over_budget=lambda wire: None,
            relay_port=relay_port,
        )
        routes.append(opened)
        keys.append(standins.by_name["OPENAI_API_KEY"])
        return opened

    for _ in range(spec["routes"]):
        route(spec["upstream"]).open_loopback()
    said: dict[str, Any] = {
        "pid": os.getpid(),
        "routes": [{"url": r.base_url, "key": k} for r, k in zip(routes, keys, strict=True)],
    }
    directory = None
    if spec.get("socket_dir"):
        directory = os.open(spec["socket_dir"], os.O_RDONLY | os.O_DIRECTORY)
        route(spec["socket_upstream"], RELAY_PORT).open_socket(directory, CONTAINER_DIR)
        said["socket"] = {"url": routes[-1].base_url, "key": keys[-1]}
    print(json.dumps(said), flush=True)
    closed = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    usages = 0
    while not closed.wait(0.2):  # what the turn's read loop does with its route's events
        usages += sum(isinstance(e, Usage) for r in routes for e in r.drain())
    usages += sum(isinstance(e, Usage) for r in routes for e in r.drain())
    totals = [(r.totals.requests, r.totals.output_tokens) for r in routes]
    for opened in routes:
        opened.close()
    if directory is not None:
        os.close(directory)
    print(json.dumps({"totals": totals, "usage_events": usages}), flush=True)


# -- the clients ------------------------------------------------------------------------------


def _connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    return conn, parts.path + "/chat/completions"


def _headers(key: str, **bench: float) -> dict[str, str]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    headers.update({f"x-bench-{name.replace('_', '-')}": str(v) for name, v in bench.items()})
    return headers


def timed_requests(url: str, key: str, count: int) -> dict[str, Any]:
    """``count`` small completions over one keep-alive connection: seconds each."""
    conn, path = _connect(url)
    body, headers = chat_request(stream=False), _headers(key)
    seconds: list[float] = []
    right = True
    for _ in range(count):
        started = time.perf_counter()
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        data = response.read()
        seconds.append(time.perf_counter() - started)
        right &= response.status == 200 and (
            json.loads(data)["choices"][0]["message"]["content"] == ANSWER
        )
    conn.close()
    return {"seconds": seconds, "right": right}


def _read_stream(
    conn: http.client.HTTPConnection, path: str, headers: dict[str, str], size: int, pause_s: float
) -> tuple[float, float, float, bool]:
    """One stream read and dropped: (request -> first byte, first byte -> end, end, whole)."""
    expected = stream_length(frames_in(size))
    started = time.perf_counter()
    conn.request("POST", path, chat_request(stream=True), headers)
    response = conn.getresponse()
    first, got, last = 0.0, 0, b""
    pause_at = expected // 4 if pause_s else expected + 1
    while data := response.read1(READ_BYTES):
        if not got:
            first = time.perf_counter()
        got += len(data)
        last = (last + data)[-16:]
        if got >= pause_at:  # nothing drains the gateway meanwhile: its buffers must not grow
            time.sleep(pause_s)
            pause_at = expected + 1
    end = time.perf_counter()
    whole = response.status == 200 and got == expected and last.endswith(b"data: [DONE]\n\n")
    return first - started, end - first, end, whole


def timed_streams(url: str, key: str, count: int, size: int, pause_s: float) -> dict[str, Any]:
    """``count`` streams over one connection, each held :data:`FIRST_TOKEN_S`; and this
    reader's own peak memory over its start (a bare reader's cost)."""
    with contextlib.suppress(OSError):  # the peak counts from here
        Path("/proc/self/clear_refs").write_text("5")
    before, cpu = memory_bytes("VmRSS"), time.process_time()
    conn, path = _connect(url)
    headers = _headers(key, bytes=size, hold_s=FIRST_TOKEN_S)
    streams = [_read_stream(conn, path, headers, size, pause_s) for _ in range(count)]
    conn.close()
    return {
        "streams": [s[:2] for s in streams],
        "growth": memory_bytes("VmHWM") - before,
        "cpu_s": time.process_time() - cpu,
        "whole": all(s[3] for s in streams),
    }


def burst(targets: list[list[str]], size: int, gap_s: float) -> dict[str, Any]:
    """One stream per target at once (a thread each, connected, then released together):
    the wall clock from the release to the last stream's end."""
    gate = threading.Barrier(len(targets) + 1)
    ends: list[float] = [0.0] * len(targets)
    whole: list[bool] = [False] * len(targets)

    def one(index: int, url: str, key: str) -> None:
        conn, path = _connect(url)
        conn.connect()
        gate.wait()
        _, _, ends[index], whole[index] = _read_stream(
            conn, path, _headers(key, bytes=size, gap_s=gap_s), size, 0
        )
        conn.close()

    threads = [
        threading.Thread(target=one, args=(i, url, key)) for i, (url, key) in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    gate.wait()
    released = time.perf_counter()
    for thread in threads:
        thread.join()
    return {"wall": max(ends) - released, "whole": sum(whole)}


CLIENTS: dict[str, Callable[..., dict[str, Any]]] = {
    "requests": timed_requests,
    "streams": timed_streams,
    "burst": burst,
}

CONTAINER_CLIENT = r"""
import http.client, json, sys, time
url, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
host, port = url.split('//')[1].split('/')[0].split(':')
conn = http.client.HTTPConnection(host, int(port), timeout=60)
body = json.dumps({'model': 'bench-model', 'stream': False,
                   'messages': [{'role': 'user', 'content': 'Say hello.'}]}).encode()
headers = {'authorization': 'Bearer ' + key, 'content-type': 'application/json'}
out, right = [], True
for i in range(count + 1):
    t = time.perf_counter()
    conn.request('POST', '/v1/chat/completions', body, headers)
    r = conn.getresponse()
    data = r.read()
    if i:
        out.append(time.perf_counter() - t)
    right = right and r.status == 200 and b'bench upstream' in data
print(json.dumps({'seconds': out, 'right': right}))
"""
"""Target 1's client in a container (standard library only; the first request, which
connects, not timed)."""


# -- running them -----------------------------------------------------------------------------


def _env() -> dict[str, str]:
    # The gateway's httpx client honours proxy variables, as a worker's does; the upstream
    # here is on this host, and a proxy between would be measured as the gateway.
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


class _Child:
    """A command of this module in a process of its own: its first line said, its last
    line when its stdin closes."""

    def __init__(self, command: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.row14_model_gateway", command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=_env(),
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"bench.row14_model_gateway {command} exited {self.proc.returncode}")
        self.said: dict[str, Any] = json.loads(line)

    def finish(self) -> dict[str, Any]:
        """Close its stdin (communicate does); what it says last."""
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}


def client(mode: str, **args: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.row14_model_gateway", "client", mode, json.dumps(args)],
        capture_output=True,
        cwd=ROOT,
        env=_env(),
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"client {mode} failed: {done.stderr[-800:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, its live threads' summed, to the nanosecond
    (``/proc/PID/task/*/schedstat``: /proc/PID/stat counts in 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread gone meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


class _Peak:
    """The highest VmRSS of a process while the block runs (sampled every few ms, and its
    VmHWM, reset at the start where the kernel lets us)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = self.after = 0

    @contextlib.contextmanager
    def watch(self) -> Iterator[_Peak]:
        reset = True
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            reset = False
        self.before = self.peak = memory_bytes("VmRSS", self.pid)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.005):
                self.peak = max(self.peak, memory_bytes("VmRSS", self.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield self
        finally:
            stop.set()
            sampler.join(5)
            self.after = memory_bytes("VmRSS", self.pid)
            if reset:
                self.peak = max(self.peak, memory_bytes("VmHWM", self.pid))

    @property
    def growth(self) -> int:
        return self.peak - self.before


@dataclass
class _Sent:
    """What went through the gateway, to hold its meter to."""

    requests: int = 0
    tokens: int = 0

    def add(self, requests: int, tokens_each: int) -> None:
        self.requests += requests
        self.tokens += requests * tokens_each


def run(bench: Bench) -> RowResult:
    sizes = SIZES.get(bench.profile, SIZES["full"])
    result = RowResult("14", "model gateway: a request and streams through a route vs direct")
    load = os.getloadavg()[0]
    upstream = _Child("upstream", "127.0.0.1")
    gateway: _Child | None = None
    try:
        gateway = _Child(
            "gateway", json.dumps({"upstream": upstream.said["url"], "routes": sizes.runs})
        )
        routes = gateway.said["routes"]
        direct = {"url": upstream.said["url"] + "/v1", "key": REAL_KEY}
        ours = {"url": routes[0]["url"], "key": routes[0]["key"]}
        sent = _Sent()
        _latency(result, sizes, direct, ours, sent)
        _streaming(result, sizes, direct, ours, sent)
        _memory(result, sizes, direct, routes[1 % len(routes)], gateway.said["pid"], sent)
        pids = (gateway.said["pid"], upstream.proc.pid)
        _at_once(result, sizes, direct, routes, pids, sent)
    finally:
        metered = gateway.finish() if gateway is not None else {}
        seen = upstream.finish()
    totals = metered.get("totals", [])
    result.checks["the upstream saw the real key on every request, never a stand-in"] = (
        seen.get("refused") == 0 and seen.get("standins_seen") == 0
    )
    result.checks["the gateway metered every request it relayed (usage from the wire)"] = (
        sum(t[0] for t in totals) == sent.requests
        and sum(t[1] for t in totals) == sent.tokens
        and metered.get("usage_events") == sent.requests
    )
    if "docker" in bench.backends:
        _in_containers(result, sizes)
    else:
        result.notes.append("through the relay in a container: not measured (no Docker)")
    result.notes.append(
        f"load average {load:.1f} at the start ({os.cpu_count()} CPUs); every figure's "
        "baseline ran alternating with it; upstream, gateway and clients are each a process"
    )
    return result


def _latency(
    result: RowResult, sizes: Sizes, direct: dict[str, str], ours: dict[str, str], sent: _Sent
) -> None:
    client("requests", **direct, count=10)
    client("requests", **ours, count=10)
    sent.add(10, ANSWER_TOKENS)
    blocks = 10
    each = max(1, sizes.requests // blocks)
    mine: list[float] = []
    theirs: list[float] = []
    right = True
    for _ in range(blocks):
        for side, into in ((direct, theirs), (ours, mine)):
            answer = client("requests", **side, count=each)
            into += answer["seconds"]
            right &= answer["right"]
    sent.add(blocks * each, ANSWER_TOKENS)
    result.checks["every small completion answered right, both ways"] = right
    ms = 1000.0
    for pct, limit in ((50, ADDED_P50_MS), (99, ADDED_P99_MS)):
        gateway_ms, direct_ms = percentile(mine, pct) * ms, percentile(theirs, pct) * ms
        result.add(
            Figure(
                f"small chat completion p{pct}: through the gateway vs direct",
                gateway_ms,
                direct_ms,
                "ms",
            ),
            Figure(
                f"  added p{pct} (gateway - direct)",
                gateway_ms - direct_ms,
                None,
                "ms",
                f"<= {limit:g} ms",
                gateway_ms - direct_ms <= limit,
            ),
        )
    result.notes.append(f"{len(mine)} small completions each way, keep-alive, in {blocks} blocks")


def _streaming(
    result: RowResult, sizes: Sizes, direct: dict[str, str], ours: dict[str, str], sent: _Sent
) -> None:
    frames = frames_in(sizes.stream_bytes)
    mine: list[list[float]] = []
    theirs: list[list[float]] = []
    whole = True
    rounds = max(1, sizes.streams // 4)
    for _ in range(rounds):
        for side, into in ((direct, theirs), (ours, mine)):
            answer = client(
                "streams", **side, count=sizes.streams // rounds, size=sizes.stream_bytes,
                pause_s=0,
            )  # fmt: skip
            into += answer["streams"]
            whole &= answer["whole"]
    sent.add(len(mine), frames)
    result.checks["every stream arrived whole (its length, its [DONE]), both ways"] = whole
    ms = 1000.0
    first_mine, first_theirs = p50([s[0] for s in mine]) * ms, p50([s[0] for s in theirs]) * ms
    rate_mine = p50([frames / s[1] for s in mine])
    rate_theirs = p50([frames / s[1] for s in theirs])
    result.add(
        Figure(
            f"stream: first byte p50 (first token after {FIRST_TOKEN_S * ms:g} ms) vs direct",
            first_mine,
            first_theirs,
            "ms",
            f"<= {1 / STREAM_SPEED:.2f}x ({STREAM_SPEED:g}x speed)",
            first_theirs / first_mine >= STREAM_SPEED,
        ),
        Figure("  first byte added p50 (gateway - direct)", first_mine - first_theirs, None, "ms"),
        Figure(
            f"stream: tokens/s p50, {mib(sizes.stream_bytes):g} MiB as fast as sent, vs direct",
            rate_mine,
            rate_theirs,
            "tokens/s",
            f">= {STREAM_SPEED:g}x",
            rate_mine >= STREAM_SPEED * rate_theirs,
        ),
    )
    result.notes.append(
        f"{len(mine)} streams each way of {frames:,} frames of {len(FRAME)} B (one token each: "
        "bytes/s is the same ratio); the upstream writes them 64 KiB at a time"
    )


def _memory(
    result: RowResult,
    sizes: Sizes,
    direct: dict[str, str],
    route: dict[str, str],
    pid: int,
    sent: _Sent,
) -> None:
    pause = 1.0
    bare = client("streams", **direct, count=1, size=sizes.memory_bytes, pause_s=pause)
    cpu = cpu_seconds(pid)
    with _Peak(pid).watch() as peak:
        through = client("streams", **route, count=1, size=sizes.memory_bytes, pause_s=pause)
    cpu = cpu_seconds(pid) - cpu
    sent.add(1, frames_in(sizes.memory_bytes))
    result.checks["the big stream arrived whole, both ways"] = bare["whole"] and through["whole"]
    size = f"{mib(sizes.memory_bytes):g} MiB"
    result.add(
        Figure(
            f"{size} stream: gateway RSS growth (peak - before) vs a bare reader's",
            mib(peak.growth),
            mib(bare["growth"]),
            "MiB",
            f"<= {RSS_LIMIT_MIB:g} MiB",
            mib(peak.growth) <= RSS_LIMIT_MIB,
        ),
        Figure(
            f"  {size} stream: gateway CPU per MiB relayed vs a bare reader's per MiB read",
            cpu * 1000 / mib(sizes.memory_bytes),
            bare["cpu_s"] * 1000 / mib(sizes.memory_bytes),
            "ms",
        ),
    )
    result.notes.append(
        f"{size} stream: gateway VmRSS {mib(peak.before):.1f} MiB before, "
        f"{mib(peak.peak):.1f} peak, {mib(peak.after):.1f} after; the reader stops "
        f"{pause:g} s a quarter of the way in (the upstream does not)"
    )


def _at_once(
    result: RowResult,
    sizes: Sizes,
    direct: dict[str, str],
    routes: list[dict[str, str]],
    pids: tuple[int, int],
    sent: _Sent,
) -> None:
    """Target 4; and, of the paced bursts, the gateway's CPU per frame relayed against the
    upstream's per frame sent (an asyncio process's floor for one frame)."""
    n = len(routes)
    gateway_pid, upstream_pid = pids
    ours = [[r["url"], r["key"]] for r in routes]
    theirs = [[direct["url"], direct["key"]]] * n
    cases = (
        ("paced", sizes.paced_frames * len(FRAME), PACED_GAP_S),
        ("unpaced", sizes.burst_bytes, 0.0),
    )
    whole = True
    peak_growth = 0
    cpu = {"ours": 0.0, "theirs": 0.0}
    for name, size, gap in cases:
        # Warm both paths (the gateway's upstream connections), untimed.
        for targets in (theirs, ours):
            whole &= client("burst", targets=targets, size=len(FRAME), gap_s=0)["whole"] == n
        sent.add(n, 1)
        walls: dict[str, list[float]] = {"ours": [], "theirs": []}
        for _ in range(sizes.bursts):
            for side, targets, pid in (
                ("theirs", theirs, upstream_pid),
                ("ours", ours, gateway_pid),
            ):
                started = cpu_seconds(pid)
                with _Peak(gateway_pid).watch() as peak:
                    answer = client("burst", targets=targets, size=size, gap_s=gap)
                if name == "paced":
                    cpu[side] += cpu_seconds(pid) - started
                if side == "ours":
                    peak_growth = max(peak_growth, peak.growth)
                walls[side].append(answer["wall"])
                whole &= answer["whole"] == n
            sent.add(n, frames_in(size))
        mine, base = p50(walls["ours"]), p50(walls["theirs"])
        if name == "paced":
            result.add(
                Figure(
                    f"{n} runs streaming at once ({sizes.paced_frames} tokens, "
                    f"{1 / PACED_GAP_S:g}/s): wall vs direct",
                    mine,
                    base,
                    "s",
                    f"<= {WALL_RATIO:g}x",
                    mine <= WALL_RATIO * base,
                )
            )
        else:
            result.add(
                Figure(
                    f"  {n} runs at once, {mib(size):g} MiB each as fast as sent: wall vs direct",
                    mine,
                    base,
                    "s",
                )
            )
    frames = n * sizes.paced_frames * sizes.bursts
    per_frame = cpu["ours"] / frames
    result.add(
        Figure(
            "  gateway CPU per paced frame relayed vs the upstream's per frame sent",
            per_frame * 1e6,
            cpu["theirs"] / frames * 1e6,
            "us",
        ),
        Figure(f"  gateway RSS growth, {n} runs streaming", mib(peak_growth), None, "MiB"),
    )
    result.checks[f"all {n} concurrent streams arrived whole, both ways, every burst"] = whole
    result.notes.append(
        f"{n} routes in one gateway process, a stand-in each; {sizes.bursts} burst(s) of each "
        "kind each way, alternating, medians; at its CPU per frame one core relays "
        f"~{1 / (per_frame * (1 / PACED_GAP_S)):,.0f} streams of {1 / PACED_GAP_S:g} tokens/s"
    )


def _in_containers(result: RowResult, sizes: Sizes) -> None:
    """Target 1 from containers: on ``none`` through the relay and the route's socket, and on
    ``bridge`` straight to the upstream on docker0's address."""
    from docker.client import from_env

    from bench.worker import DEMO_IMAGE

    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    workdir.chmod(0o755)  # the container's user reaches the socket through it
    upstream = _Child("upstream", DOCKER_HOST)
    gateway: _Child | None = None
    api = from_env()
    made: list[Any] = []
    try:
        url = upstream.said["url"]
        spec = {"upstream": url, "routes": 0, "socket_dir": str(workdir), "socket_upstream": url}
        gateway = _Child("gateway", json.dumps(spec))
        route = gateway.said["socket"]

        def container(network: str, **kwargs: Any) -> Any:
            made.append(
                api.containers.run(
                    DEMO_IMAGE, ["sleep", "600"], detach=True, user="1000:1000",
                    cap_drop=["ALL"], network=network, name=f"bench-gw-{uuid.uuid4().hex[:8]}",
                    **kwargs,
                )
            )  # fmt: skip
            return made[-1]

        through = container("none", volumes={str(workdir): {"bind": CONTAINER_DIR, "mode": "rw"}})
        bridged = container("bridge")
        # One relay for the container's life, as for a turn's (its command a sleep here; the
        # clients are exec'd beside it, in its network namespace).
        through.exec_run(
            ["python3", f"{CONTAINER_DIR}/model-relay.py", str(RELAY_PORT),
             f"{CONTAINER_DIR}/model.sock", "sleep", "600"],
            detach=True,
        )  # fmt: skip

        def measure(target: Any, base: str, key: str, n: int) -> dict[str, Any]:
            code, out = target.exec_run(["python3", "-c", CONTAINER_CLIENT, base, key, str(n)])
            if code != 0:
                raise RuntimeError(out.decode()[-800:])
            answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
            return answer

        deadline = time.monotonic() + 10
        while True:  # until the relay listens
            try:
                measure(through, route["url"], route["key"], 1)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        blocks = 5
        each = max(1, sizes.container_requests // blocks)
        mine: list[float] = []
        theirs: list[float] = []
        right = True
        for _ in range(blocks):
            answer = measure(bridged, url + "/v1", REAL_KEY, each)
            theirs += answer["seconds"]
            right &= answer["right"]
            answer = measure(through, route["url"], route["key"], each)
            mine += answer["seconds"]
            right &= answer["right"]
        result.checks["every completion from the containers answered right, both ways"] = right
        ms = 1000.0
        for pct in (50, 99):
            gateway_ms, direct_ms = percentile(mine, pct) * ms, percentile(theirs, pct) * ms
            result.add(
                Figure(
                    f"container: small completion p{pct}, relay on network none vs bridge",
                    gateway_ms,
                    direct_ms,
                    "ms",
                ),
                Figure(f"  added p{pct} (relay - bridge)", gateway_ms - direct_ms, None, "ms"),
            )
        result.notes.append(
            f"containers: {len(mine)} completions each way (demo image, user 1000, a client "
            "process per block), the upstream on docker0's address"
        )
    finally:
        for item in made:
            with contextlib.suppress(Exception):
                item.remove(force=True)
        api.close()
        if gateway is not None:
            gateway.finish()
        seen = upstream.finish()
        shutil.rmtree(workdir, ignore_errors=True)
    result.checks["the upstream saw the real key from the relay's requests, never a stand-in"] = (
        seen.get("refused") == 0 and seen.get("standins_seen") == 0
    )


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "upstream" and len(argv) == 2:
        asyncio.run(_serve_upstream(argv[1]))
    elif command == "gateway" and len(argv) == 2:
        _serve_gateway(json.loads(argv[1]))
    elif command == "client" and len(argv) == 3 and argv[1] in CLIENTS:
        print(json.dumps(CLIENTS[argv[1]](**json.loads(argv[2]))), flush=True)
    else:
        sys.stderr.write(
            "usage: python -m bench.row14_model_gateway upstream HOST | gateway SPEC | "
            f"client {'|'.join(CLIENTS)} ARGS\n"
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
