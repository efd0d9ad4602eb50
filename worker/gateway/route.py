"""One turn's model route: the gateway's listener for the turn, what it decides, what it saw.

A route is open while the turn's harness runs and closed with it. It listens where the
harness can reach it and nothing else can matter:

- **a Unix socket** in the run's HOME (``.harness-endpoint/model.sock``, made through
  no-follow descriptors like the MCP endpoint's), reached by the relay on the sandbox's own
  loopback (:mod:`worker.gateway.relay`): every Docker network mode but ``host``, ``none``
  included;
- **TCP on this host's loopback** (an ephemeral port) for a harness that shares the host's
  network (the local sandbox, Docker's ``host``): it is already on this side.

What the proxy meets is queued as events for the turn's stream (drained by the read loop):
a ``usage`` of source ``gateway`` per answered model call (the wire's own count and the model
that served it), and ``sandbox-activity`` of kind ``model`` for a fallback or a refusal. A
rate limit or an exhausted quota at the upstream, or a budget spent, is the turn's ``halt``:
the read loop stops the harness with it, whatever the harness made of the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from adapters.events import ErrorReason, Event, SandboxActivity, SessionError, Usage, session_error
from sandbox.base import ExecSpec
from sandbox.store import safe_fs
from worker.gateway import relay, wire
from worker.gateway.proxy import ModelProxy, Policy, Refusal
from worker.gateway.upstream_client import UpstreamClient, upstream_client
from worker.tools.endpoint import EndpointLoop

log = logging.getLogger(__name__)

SOCKET = "model.sock"
RELAY = "model-relay.py"
RELAY_SOURCE = Path(relay.__file__).read_bytes()
"""The relay's text, shipped into the sandbox each turn (read once, as the MCP bridge's)."""
ALIVE_CHECK_S = 1.0


class GatewayLoop(EndpointLoop):
    """The worker process's asyncio loop for every turn's route (as the MCP endpoints have
    theirs), with the clients its upstream connections are pooled in (one per operator
    settings)."""

    NAME: ClassVar[str] = "model-gateway"
    _shared: ClassVar[EndpointLoop | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._clients: dict[tuple[frozenset[tuple[str, str]], str | None], UpstreamClient] = {}
        self._lock = threading.Lock()

    def client(self, pins: Mapping[str, str], ca_file: str | None) -> UpstreamClient:
        key = (frozenset(pins.items()), ca_file)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = self.call(self._make(pins, ca_file))
            return found

    @staticmethod
    async def _make(pins: Mapping[str, str], ca_file: str | None) -> UpstreamClient:
        return upstream_client(pins, ca_file)


@dataclass
class WireTotals:
    """What the gateway counted this turn, from the upstream's own answers."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    requests: int = 0
    served_model: str | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelRoute:
    """One turn's route (see the module's docstring). ``alive`` says whether the turn's
    credential still stands (asked from the turn's thread at most once a second);
    ``over_budget`` whether the run's budget is spent, given what the wire counted so far."""

    def __init__(
        self,
        policy: Policy,
        *,
        run_id: str,
        alive: Callable[[], bool],
        over_budget: Callable[[WireTotals], SessionError | None],
        relay_port: int,
        loop: GatewayLoop | None = None,
    ) -> None:
        self.policy, self.run_id = policy, run_id
        self._alive, self._over_budget = alive, over_budget
        self.relay_port = relay_port
        self.loop = loop or GatewayLoop.shared()
        self.client = self.loop.client(policy.pins, policy.ca_file)
        self.totals = WireTotals()
        self.halt: SessionError | None = None
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._standing = True
        self._checked = time.monotonic()
        self._closed = False
        self._server: asyncio.AbstractServer | None = None
        self._directory: int | None = None
        self._relay_dir: str | None = None
        self.port: int | None = None
        """The loopback port the harness connects to (the relay's, or the host's)."""

    # -- where the harness reaches it ---------------------------------------------------------

    def open_socket(self, directory: int, inside: str) -> None:
        """Serve on ``model.sock`` in the directory open as ``directory`` (the run's
        ``.harness-endpoint``, seen as ``inside`` in the sandbox), with the relay beside it."""
        safe_fs.put_file(directory, RELAY, RELAY_SOURCE, 0o644)
        listener = safe_fs.bind_socket(directory, SOCKET, 0o666)
        self._directory, self._relay_dir = directory, inside
        proxy = ModelProxy(self.policy, self, self.client)
        self._server = self.loop.call(asyncio.start_unix_server(proxy.serve, sock=listener))
        self.port = self.relay_port

    def open_loopback(self) -> None:
        """Serve on an ephemeral port of this host's loopback."""
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on such sockets, and a response's
        # body written after its head would otherwise wait ~40 ms for a delayed ACK.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self.port = int(listener.getsockname()[1])
        proxy = ModelProxy(self.policy, self, self.client)
        self._server = self.loop.call(asyncio.start_server(proxy.serve, sock=listener))

    @property
    def base_url(self) -> str:
        assert self.port is not None
        return self.policy.upstream.local(self.port)

    def wrap(self, spec: ExecSpec) -> ExecSpec:
        """The turn's command, behind the relay when the route is a socket."""
        if self._relay_dir is None:
            return spec
        inside = self._relay_dir
        relay = ("python3", f"{inside}/{RELAY}", str(self.relay_port), f"{inside}/{SOCKET}")
        return ExecSpec(
            argv=(*relay, *spec.argv),
            stdin=spec.stdin,
            env=spec.env,
            files=spec.files,
            cwd=spec.cwd,
            keep_stdin=spec.keep_stdin,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            with contextlib.suppress(Exception):
                self.loop.call(self._shutdown(self._server))
        directory, self._directory = self._directory, None
        if directory is not None:
            with contextlib.suppress(FileNotFoundError, OSError):
                safe_fs.unlink(directory, SOCKET)

    @staticmethod
    async def _shutdown(server: asyncio.AbstractServer) -> None:
        server.close()
        # Connections in flight end with the server (3.12 closes them; before, they end
        # when their harness, killed with its turn, hangs up).
        if hasattr(server, "close_clients"):
            server.close_clients()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)

    # -- the turn's side: events and the halt --------------------------------------------------

    def drain(self) -> list[Event]:
        now = time.monotonic()
        if self._standing and now - self._checked >= ALIVE_CHECK_S:
            self._checked = now
            try:
                self._standing = self._alive()
            except Exception:  # noqa: BLE001 - Redis away: the turn's own checks decide
                log.warning("gateway.alive_check_failed", extra={"run_id": self.run_id})
        events: list[Event] = []
        with contextlib.suppress(queue.Empty):
            while True:
                events.append(self._events.get_nowait())
        return events

    # -- the proxy's hooks (on the gateway's loop) ----------------------------------------------

    def refusal(self) -> Refusal | None:
        if self._closed:
            return Refusal(401, "turn_over", "harness-worker model gateway: the turn is over")
        if not self._standing:
            return Refusal(
                401, "credential_revoked", "harness-worker model gateway: the run has ended"
            )
        halt = self.halt
        if halt is not None:
            # The turn is being stopped: a CLI's own retry goes no further than the gateway.
            if halt.reason == "budget":
                return Refusal(400, "budget_exceeded", f"harness-worker: {halt.error}")
            return Refusal(429, halt.reason, f"harness-worker: the turn is stopped: {halt.error}")
        over = self._over_budget(self.totals)
        if over is not None:
            self.halt = over
            return Refusal(400, "budget_exceeded", f"harness-worker: {over.error}")
        return None

    def refused(self, refusal: Refusal) -> None:
        self._events.put(
            SandboxActivity(
                kind="model",
                description=f"the model gateway refused a request ({refusal.status}): "
                f"{refusal.message}",
            )
        )

    def fell_back(self, model: str, status: int, next_model: str) -> None:
        self._events.put(
            SandboxActivity(
                kind="model",
                description=f"model fallback: {model} answered {status}; asking {next_model}",
            )
        )

    def metered(self, exchange: wire.Exchange, fallback_from: str | None) -> None:
        totals = self.totals
        if 200 <= exchange.status < 300:
            totals.requests += 1
            totals.input_tokens += exchange.input_tokens
            totals.output_tokens += exchange.output_tokens
            totals.cached_input_tokens += exchange.cached_input_tokens
            totals.served_model = exchange.served_model or totals.served_model
            self._events.put(
                Usage(
                    input_tokens=exchange.input_tokens,
                    output_tokens=exchange.output_tokens,
                    cached_input_tokens=exchange.cached_input_tokens,
                    source="gateway",
                    model=exchange.served_model,
                )
            )
            if fallback_from is not None:
                self._events.put(
                    SandboxActivity(
                        kind="model",
                        description=f"model fallback: {exchange.served_model or 'the next model'}"
                        f" served the request for {fallback_from}",
                    )
                )
            return
        if exchange.limit is not None and self.halt is None:
            # Overloaded (529) with no fallback left is a rate limit of the API's making.
            reason: ErrorReason = "quota" if exchange.limit == "quota" else "rate-limited"
            what = exchange.error or f"status {exchange.status}"
            self.halt = session_error(
                f"the model API answered {exchange.status}: {what}",
                reason,
                # A quota that names no reset is a spend cap: sending the turn again would
                # meet it again.
                retryable=reason == "rate-limited" or exchange.retry_after_s is not None,
                retry_after_s=exchange.retry_after_s,
            )
