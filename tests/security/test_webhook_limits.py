"""A webhook receiver is the tenant's: whatever it answers, and however slowly, costs the API
process a bounded amount of memory and time, and holds back no other tenant's deliveries.

Against a real ``harness api`` process, a real worker (demo harness, local sandbox) and real
receivers on loopback. The operator names ``127.0.0.1`` in ``HARNESS_WEBHOOK_HOSTS`` so the
receivers can be local: that setting lifts only the address check (which
tests/security/test_address_policy.py holds), not a single limit tested here.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.api_server import ApiProcess, api_env, api_worker, start_api  # noqa: F401
from tests.integration.conftest import Env, WorkerProcess
from tests.integration.test_api import start, wait_terminal

pytestmark = [pytest.mark.redis, pytest.mark.celery]

MiB = 1024 * 1024
DEADLINE_S = 3.0
LIMITS = {
    "HARNESS_WEBHOOK_SCHEMES": "http",
    "HARNESS_WEBHOOK_HOSTS": "127.0.0.1",
    "HARNESS_WEBHOOK_POLL_S": "0.1",
    "HARNESS_WEBHOOK_TIMEOUT_S": str(DEADLINE_S),
    "HARNESS_WEBHOOK_BACKOFF_S": "120",  # no retry within a test: each attempt is counted
    "HARNESS_WEBHOOK_LEASE_S": "120",
    "HARNESS_WEBHOOK_CONCURRENCY": "4",
    "HARNESS_WEBHOOK_PER_TENANT": "2",
}


@dataclass
class Connection:
    """One delivery a receiver took: when, and until when the API held it open."""

    opened: float
    closed: float | None = None
    sent: int = 0
    """Bytes of reply written before the API closed the connection (or all of it)."""


@dataclass
class Receiver:
    """A receiver on 127.0.0.1 that answers every delivery with ``reply``."""

    server: ThreadingHTTPServer
    connections: list[Connection] = field(default_factory=list)
    peak: int = 0
    """The most deliveries it held at once."""
    _open: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 60) -> list[Connection]:
        deadline = time.monotonic() + timeout
        while len(self.connections) < count:
            assert time.monotonic() < deadline, f"{len(self.connections)} deliveries, not {count}"
            time.sleep(0.02)
        return list(self.connections)

    def wait_closed(self, count: int, timeout: float = 60) -> list[Connection]:
        deadline = time.monotonic() + timeout
        while sum(c.closed is not None for c in self.connections) < count:
            assert time.monotonic() < deadline, "the API still holds its deliveries"
            time.sleep(0.05)
        return list(self.connections)


def _receiver(reply: str) -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            box = holder[0]
            conn = Connection(time.monotonic())
            with box._lock:
                box.connections.append(conn)
                box._open += 1
                box.peak = max(box.peak, box._open)
            try:
                if reply == "big":
                    self._big(conn)
                elif reply == "trickle":
                    self._trickle(conn)
                else:
                    self.send_response(204)
                    self.end_headers()
            except OSError:
                pass  # the API closed the connection: what this test looks for
            finally:
                conn.closed = time.monotonic()
                with box._lock:
                    box._open -= 1

        def _big(self, conn: Connection) -> None:
            """A 2xx whose body is 300 MiB, sent as fast as it is read."""
            self.send_response(200)
            self.send_header("content-length", str(300 * MiB))
            self.end_headers()
            chunk = b"x" * MiB
            for _ in range(300):
                self.wfile.write(chunk)
                conn.sent += len(chunk)

        def _trickle(self, conn: Connection) -> None:
            """The status line one byte a second, for up to 40 s: every read gets something
            within a per-read timeout, the reply never ends."""
            for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-slow: " + b"z" * 40:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                conn.sent += 1
                # A second between bytes, watching for the API to close the connection (the
                # moment it does is when the delivery stopped holding a slot).
                readable, _, _ = select.select([self.connection], [], [], 1.0)
                if readable and not self.connection.recv(1):
                    return
            self.wfile.write(b"\r\n\r\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    server.shutdown()
    server.server_close()


@pytest.fixture
def big() -> Iterator[Receiver]:
    yield from _receiver("big")


@pytest.fixture
def trickle() -> Iterator[Receiver]:
    yield from _receiver("trickle")


@pytest.fixture
def fast() -> Iterator[Receiver]:
    yield from _receiver("fast")


@pytest.fixture
def limited(api_env: Env, api_worker: WorkerProcess) -> Iterator[ApiProcess]:  # noqa: F811
    server = start_api(api_env, "webhook-limits", **LIMITS)
    yield server
    server.stop()


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_300_mib_reply_costs_the_api_no_more_than_a_bounded_read(
    limited: ApiProcess, big: Receiver, fast: Receiver
) -> None:
    limited.add_tenant("hoarder")
    with limited.client("hoarder") as http:
        warm = start(http, "warm up", webhook_url=fast.url)  # code paths loaded, pools made
        fast.wait(1)
        wait_terminal(http, warm, 1)
        before = peak_rss(limited.proc.pid)
        runs = [start(http, f"big {n}", webhook_url=big.url) for n in range(2)]
        deliveries = big.wait_closed(2, timeout=60)
        for run_id in runs:
            wait_terminal(http, run_id, 1)
    time.sleep(1)  # whatever the API was still reading, it has read
    grown = peak_rss(limited.proc.pid) - before
    assert grown < 48 * MiB, f"the API's peak memory grew by {grown / MiB:.0f} MiB"
    # The rest of each reply was never read: the API closed the connection (what loopback's
    # socket buffers took before it did is all that was written).
    assert all(d.sent < 64 * MiB for d in deliveries), [d.sent // MiB for d in deliveries]
    # A 2xx is a delivery done, however much it carried: no second attempt.
    time.sleep(1)
    assert len(big.connections) == 2


def test_a_trickling_receiver_is_cut_off_at_the_deadline_and_holds_back_no_other_tenant(
    limited: ApiProcess, trickle: Receiver, fast: Receiver
) -> None:
    limited.add_tenant("slowpoke")
    limited.add_tenant("bystander")
    with limited.client("slowpoke") as slow, limited.client("bystander") as other:
        for n in range(3):
            start(slow, f"slow {n}", webhook_url=trickle.url)
        trickle.wait(2)  # the slow tenant's share of slots is held...
        run_id = start(other, "prompt", webhook_url=fast.url)
        wait_terminal(other, run_id, 1)
        ended = time.monotonic()
        got = fast.wait(1, timeout=30)[0]
        # ...and the other tenant's delivery goes out at once, not after the slow ones.
        assert got.opened - ended < 2.0, f"delivered {got.opened - ended:.1f} s after the turn"
        assert all(c.closed is None for c in trickle.connections[:2])  # still trickling then
    # Each slow delivery is cut off at HARNESS_WEBHOOK_TIMEOUT_S in all, although a byte came
    # every second (a per-read timeout would never fire); the third waited for a free slot.
    held = trickle.wait_closed(3, timeout=30)
    for conn in held:
        assert conn.closed is not None
        assert conn.closed - conn.opened < DEADLINE_S + 2.0, conn
    assert trickle.peak <= 2  # HARNESS_WEBHOOK_PER_TENANT
