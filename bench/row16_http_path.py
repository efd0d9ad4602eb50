"""Row 16: the HTTP path. A backend starts a no-op demo turn (``@complete ok``) with
``POST /v1/runs`` on one ``harness api`` process (uvicorn, row 12's server) and reads the new
run's ``GET /v1/runs/{id}/events/stream`` at once: request sent -> its first SSE event, and
-> its terminal event. The baseline is the same run started in this process with
``HarnessClient.start_run`` (same harness, input, sandbox backend, worker) and the same two
events read from Redis with ``XREAD BLOCK``. Ours and the baseline alternate, each pair in
the other order from the last, so a shared machine's load falls on both; every run is ended
(``DELETE`` or ``client.end``, waiting for the teardown) before the next pair begins, so
containers do not pile up and no teardown runs under a measurement.

The API's requests go over one kept connection (an ``httpx.Client``), as a backend's would;
each event stream opens a connection of its own, as it must over HTTP/1.1 (a stream that is
left mid-way cannot hand its connection back), and that connect is in our figures.

Each run's turn varies by tens of milliseconds (a container's start, on Docker), which the
difference of two p50s carries: with n runs its standard error is about that spread over
sqrt(n), so each such line is followed by its bootstrap 95% interval (pairs resampled whole).
The target's verdict is on the line that carries no turn: the overhead from its parts, each
timed on its own run, (POST answered - ``start_run`` returned) + (the event's publish ->
received, SSE - ``XREAD``), p50 of each. It is an upper bound: the POST's way back to the
client is in it, though the turn starts before it. The stream's opening is in it too when
it matters: a stream whose headers come after the first event was published receives that
event late, and its delivery says so (the line counting runs whose headers came first says
how often). What it cannot see is the CPU the API and its client take from the worker's turn
start on a machine of few cores: only the plain differences, printed beside it with their
intervals, carry that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import httpx

from adapters.events import TERMINAL_TYPES
from bench.consume import wait_terminal
from bench.context import NOOP, Bench
from bench.docker_raw import RawDocker
from bench.row12_api import ApiServer
from bench.stats import bootstrap_interval, p50, percentile
from bench.table import Figure, RowResult, fmt

TARGET_MS = 5.0
"""Issue 41: the HTTP path (the API's request, its tenant checks, the SSE hub) adds at most
5 ms at p50 to what a producer of the Python client sees."""


@dataclass(frozen=True)
class PathSizes:
    runs: int
    """Measured runs of each kind per backend."""
    warmup: int


SIZES = {
    "full": PathSizes(runs=200, warmup=3),
    "quick": PathSizes(runs=20, warmup=2),
    "smoke": PathSizes(runs=3, warmup=1),
}
Entries = list[tuple[str, dict[str, str]]]


@dataclass(frozen=True)
class Sample:
    """One run, each time in seconds from the moment its start was asked for."""

    run_id: str
    answered: float
    """The start call returned (the 201, or ``start_run``)."""
    opened: float
    """The event stream's headers came (the client's: as ``answered``, it opens nothing)."""
    first: float
    terminal: float
    terminal_type: str
    first_delivered: float
    """The first event's publish time (its entry's ``ts``) -> this consumer had it."""
    delivered: float
    """The terminal's publish time -> this consumer had it."""
    opened_first: bool
    """The stream's headers came before the first event was published (the client's: it
    reads from the stream's start, nothing to open)."""
    ids: list[str]
    """The ids of the run's events as this consumer received them, the terminal's last."""
    stored: list[str]
    """The ids of the run's stream entries up to the terminal, read back from Redis."""


@dataclass
class Measured:
    ours: list[Sample] = field(default_factory=list)
    base: list[Sample] = field(default_factory=list)
    complete: bool = True
    """Every stream, of either kind, ended with turn-complete."""
    same_ids: bool = True
    """Every SSE stream's event ids were the run's stream entries, in order."""
    run_ids: list[str] = field(default_factory=list)


def sse_frames(response: httpx.Response) -> Iterator[tuple[str, str, float, float]]:
    """(id, event, perf_counter and time.time() when the frame was whole) of each SSE
    message with an id."""
    entry_id = kind = ""
    for line in response.iter_lines():
        if line.startswith("id: "):
            entry_id = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif not line and entry_id:
            yield entry_id, kind, time.perf_counter(), time.time()
            entry_id = kind = ""


def through_api(
    bench: Bench, requests: httpx.Client, streams: httpx.Client, body: dict[str, Any]
) -> Sample:
    started = time.perf_counter()
    reply = requests.post("/v1/runs", json=body)
    answered = time.perf_counter()
    if reply.status_code != 201:
        raise RuntimeError(f"POST /v1/runs answered {reply.status_code}: {reply.text[:300]}")
    run_id: str = reply.json()["run_id"]
    frames = []
    with streams.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
        opened, opened_wall = time.perf_counter(), time.time()
        if response.status_code != 200:
            raise RuntimeError(f"the event stream of {run_id} answered {response.status_code}")
        for frame in sse_frames(response):
            frames.append(frame)
            if frame[1] in TERMINAL_TYPES:
                break
        else:
            raise RuntimeError(f"the event stream of {run_id} closed before its terminal")
    terminal_id, kind, at, wall = frames[-1]
    stored = cast(Entries, bench.redis.xrange(bench.stream(run_id), "-", terminal_id))
    first_published = float(stored[0][1]["ts"])
    return Sample(
        run_id,
        answered - started,
        opened - started,
        frames[0][2] - started,
        at - started,
        kind,
        frames[0][3] - first_published,
        wall - float(stored[-1][1]["ts"]),
        opened_wall <= first_published,
        [frame[0] for frame in frames],
        [entry_id for entry_id, _ in stored],
    )


def through_client(bench: Bench, backend: str) -> Sample:
    started = time.perf_counter()
    run_id = bench.start_run(backend, NOOP)
    answered = time.perf_counter()
    seen_at, events = wait_terminal(bench.redis, bench.stream(run_id), 1, timeout_s=120)
    # wait_terminal stamps each reply with perf_counter and time.time() together; the first
    # event's perf_counter is the terminal's less the wall time between their replies.
    first = seen_at - (events[-1].at - events[0].at)
    ids = [e.id for e in events]
    return Sample(
        run_id,
        answered - started,
        answered - started,
        first - started,
        seen_at - started,
        events[-1].type,
        events[0].at - events[0].ts,
        events[-1].at - events[-1].ts,
        True,
        ids,
        ids,
    )


def measure(bench: Bench, server: ApiServer, backend: str, sizes: PathSizes) -> Measured:
    body = {
        "harness": "stdio-json",
        "input": NOOP,
        "executable": bench.executable(backend),
        "sandbox": backend,
        "network": "none",
    }
    headers = {"Authorization": f"Bearer {server.key}"}
    timeout = httpx.Timeout(120, connect=30)
    out = Measured()
    with (
        httpx.Client(base_url=server.url, headers=headers, timeout=timeout) as requests,
        httpx.Client(base_url=server.url, headers=headers, timeout=timeout) as streams,
    ):
        for i in range(sizes.warmup + sizes.runs):
            if i % 2 == 0:
                ours = through_api(bench, requests, streams, body)
                base = through_client(bench, backend)
            else:
                base = through_client(bench, backend)
                ours = through_api(bench, requests, streams, body)
            # Whether these ended is the "no run left" check's question, asked at the end.
            requests.delete(f"/v1/runs/{ours.run_id}", params={"wait": 60})
            bench.end_run(base.run_id)
            out.run_ids += [ours.run_id, base.run_id]
            out.complete &= ours.terminal_type == base.terminal_type == "turn-complete"
            out.same_ids &= ours.ids == ours.stored
            if i >= sizes.warmup:
                out.ours.append(ours)
                out.base.append(base)
    return out


def runs_left(bench: Bench, run_ids: list[str], backend: str) -> list[str]:
    """The runs not ended, and (Docker) those whose container is still there."""
    left = [r for r in run_ids if bench.client.status(r)["status"] != "ended"]
    if backend == "docker":
        raw = RawDocker()
        try:
            found = raw.client.containers.list(
                all=True, filters={"label": f"harness.scope={bench.env.scope}"}
            )
            left += [c.labels.get("harness.run_id", "") for c in found]
        finally:
            raw.close()
    return [r for r in left if r in set(run_ids)]


def _ms(samples: list[Sample], attr: str) -> list[float]:
    return [getattr(s, attr) * 1000 for s in samples]


def _p50_of(values: list[float], pairs: Sequence[int]) -> float:
    return p50([values[i] for i in pairs])


def _interval(measure: str, difference: Callable[[Sequence[int]], float], n: int) -> Figure:
    """The bootstrap 95% interval of ``difference`` (pairs resampled whole), as a line."""
    low, high = bootstrap_interval(difference, n)
    return Figure(measure, None, None, "ms", ours_text=f"[{fmt(low)}, {fmt(high)}] ms")


def overhead_figures(
    backend: str, m: Measured, attr: str, delivered: str, what: str
) -> list[Figure]:
    """The HTTP path's overhead to one event, two ways: the difference of the two p50s
    (carries each run's own turn start, tens of ms apart on Docker: its interval says how
    far it can be trusted) and from its parts, which carry no turn (the target's line)."""
    ours, base = _ms(m.ours, attr), _ms(m.base, attr)
    lines = [
        Figure(
            f"{backend}: POST /v1/runs -> SSE {what} p{pct} vs start_run -> XREAD",
            percentile(ours, pct),
            percentile(base, pct),
            "ms",
        )
        for pct in (50, 99)
    ]
    n = len(ours)

    def plain(pairs: Sequence[int]) -> float:
        return _p50_of(ours, pairs) - _p50_of(base, pairs)

    answered = _ms(m.ours, "answered"), _ms(m.base, "answered")
    delivery = _ms(m.ours, delivered), _ms(m.base, delivered)

    def parts(pairs: Sequence[int]) -> float:
        started = _p50_of(answered[0], pairs) - _p50_of(answered[1], pairs)
        return started + _p50_of(delivery[0], pairs) - _p50_of(delivery[1], pairs)

    everything = range(n)
    from_parts = parts(everything)
    lines += [
        Figure(
            f"{backend}:   HTTP path's overhead to the {what} p50 (ours - baseline)",
            plain(everything),
            None,
            "ms",
        ),
        _interval(f"{backend}:     its bootstrap 95% interval (the turns' spread)", plain, n),
        Figure(
            f"{backend}:   HTTP path's overhead to the {what} from its parts p50: POST answered"
            " - start_run returned + delivery SSE - XREAD",
            from_parts,
            None,
            "ms",
            target=f"<= {TARGET_MS:g} ms",
            met=from_parts <= TARGET_MS,
        ),
        _interval(f"{backend}:     its bootstrap 95% interval", parts, n),
    ]
    return lines


def figures(backend: str, m: Measured) -> list[Figure]:
    lines = overhead_figures(backend, m, "first", "first_delivered", "first event")
    lines += overhead_figures(backend, m, "terminal", "delivered", "terminal event")
    headers_first = sum(s.opened_first for s in m.ours)
    lines += [
        Figure(
            f"{backend}:   of it: POST /v1/runs answered p50 vs start_run returned",
            p50(_ms(m.ours, "answered")),
            p50(_ms(m.base, "answered")),
            "ms",
        ),
        Figure(
            f"{backend}:   of it: POST answered -> the event stream's headers p50",
            p50([(s.opened - s.answered) * 1000 for s in m.ours]),
            None,
            "ms",
        ),
        Figure(
            f"{backend}:   of it: the stream's headers before the first event was published",
            headers_first,
            None,
            "runs",
            ours_text=f"{headers_first} of {len(m.ours)} runs",
        ),
        Figure(
            f"{backend}:   of it: first event published -> received p50, SSE vs XREAD",
            p50(_ms(m.ours, "first_delivered")),
            p50(_ms(m.base, "first_delivered")),
            "ms",
        ),
        Figure(
            f"{backend}:   of it: terminal published -> received p50, SSE vs XREAD",
            p50(_ms(m.ours, "delivered")),
            p50(_ms(m.base, "delivered")),
            "ms",
        ),
    ]
    return lines


def run(bench: Bench) -> RowResult:
    sizes = SIZES.get(bench.profile, SIZES["full"])
    result = RowResult(
        "16", f"the HTTP path: POST /v1/runs + SSE vs start_run + XREAD ({sizes.runs} runs each)"
    )
    _ = bench.worker  # the API's runs and the client's go to the same worker
    # Row 12 may have made its tenant in this session's folder already; its server makes
    # the tenant again, with a key of its own.
    (bench.tmp / "bench-tenants.json").unlink(missing_ok=True)
    measured: dict[str, Measured] = {}
    with ApiServer(bench) as server:
        for backend in bench.backends:
            measured[backend] = measure(bench, server, backend, sizes)
    for backend, m in measured.items():
        result.add(*figures(backend, m))
        result.checks[f"{backend}: every run's stream (SSE, XREAD) ended with turn-complete"] = (
            m.complete and len(m.ours) == len(m.base) == sizes.runs
        )
        result.checks[f"{backend}: the SSE event ids are the Redis stream's ids"] = m.same_ids
        left = runs_left(bench, m.run_ids, backend)
        result.checks[f"{backend}: no run left (all ended, no container of theirs)"] = not left
    if bench.docker_skip:
        result.notes.append(f"docker lines skipped: {bench.docker_skip}")
    result.notes.append(
        "the SSE client runs in the bench process, on the same cores as the API and worker"
    )
    return result
