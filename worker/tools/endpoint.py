"""The run's MCP endpoint: a Unix socket in the run's sandbox, served by the worker.

One thread per worker process runs an asyncio loop that serves every open endpoint
(:class:`EndpointLoop`). A turn opens its run's endpoint before the harness starts and closes
it once the harness has stopped (:class:`RunEndpoint`); the socket lives in the run's HOME,
which every backend shares with its sandbox (a bind mount for a container), so it is
reachable under every network mode, ``none`` included; it is bound and removed through a
descriptor of its directory, never by a path the sandbox could turn into a link
(:func:`sandbox.store.safe_fs.bind_socket`). The harness reaches it through the
stdio bridge (:mod:`worker.tools.bridge`), which it launches as a stdio MCP server.

A connection starts with one line of ours, ``{"token": ..., "server": NAME}``: the run's
credential (``HARNESS_RUN_TOKEN``) and the attached server it wants. The endpoint answers
``{"ok": true}`` and then speaks MCP (newline-delimited JSON-RPC, the official SDK's
low-level server), or ``{"ok": false, "error": ...}`` and closes. The token is checked
again on every call against the run's live credential: a wrong, older or revoked token
(after ``end``, a lease that expired, any teardown) is refused.

Each call is published as a ``tool-call`` and its end as a ``tool-result`` through the turn's
own publisher: the endpoint queues them and the turn's read loop drains the queue
(:meth:`RunEndpoint.drain`), so they land before the turn's terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from adapters.events import TOOL_TEXT_LIMIT, Event, SandboxActivity, ToolCall, ToolResult
from sandbox.base import UnsafePath
from sandbox.store import safe_fs
from worker.observe import metrics, tracing
from worker.observe.masking import Masker
from worker.permissions.requests import shown_input
from worker.tools.backend import Backend, BackendError, Reply

log = logging.getLogger(__name__)
T = TypeVar("T")

HANDSHAKE_LIMIT = 4096
"""The first line of a connection is at most this long (a token and a server name)."""
HANDSHAKE_TIMEOUT_S = 10.0
LINE_LIMIT = 4 * 1024 * 1024
"""A JSON-RPC message from the harness is at most this long; a longer one closes its
connection (a harness reading our answers is never cut short)."""
CUT_NOTE = "\n[cut by the worker: the result was {size} characters; {kept} are shown]"


@dataclass(frozen=True)
class ToolLimits:
    timeout_s: float = 60.0
    result_max_chars: int = 100_000
    in_flight: int = 8


@dataclass(frozen=True)
class RunTools:
    """What one turn's endpoint serves, and to whom."""

    run_id: str
    turn: int
    socket_path: Path
    """Where the socket is, on the worker's host (inside the run's HOME)."""
    servers: Mapping[str, Backend]
    verify: Callable[[str], bool]
    """Whether a token is the run's live credential (blocking: it asks Redis)."""
    masker: Masker
    directory: int | None = None
    """The socket's directory, open (the caller's, kept open while the endpoint is): the socket
    is bound and removed through it, never through a path the sandbox could have turned into a
    link. None: the endpoint opens ``socket_path``'s directory itself, a path of the worker's
    (made if missing)."""
    limits: ToolLimits = ToolLimits()
    ask: Asker | None = None
    """Under ``--posture ask``, for a harness that does not ask for MCP calls itself: asked
    before each call (:mod:`worker.tools.asking`)."""


class Asker(Protocol):
    def __call__(self, server: str, tool: str, arguments: dict[str, Any]) -> str | None:
        """None when the call may be made, else what the harness is told (blocks)."""

    def close(self, wait_s: float = 5.0) -> None:
        """Deny what still waits."""


class EndpointLoop:
    """The worker process's asyncio loop for every run endpoint, on a daemon thread (one per
    subclass: the model gateway's is :class:`worker.gateway.route.GatewayLoop`)."""

    NAME: ClassVar[str] = "mcp-endpoint"
    _shared: ClassVar[EndpointLoop | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=self.NAME, daemon=True)
        self.thread.start()

    @classmethod
    def shared(cls) -> Self:
        with cls._shared_lock:
            found = cls._shared
            if not isinstance(found, cls) or not found.thread.is_alive():
                found = cls._shared = cls()
            return found

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


class RunEndpoint:
    """One turn's endpoint: :meth:`open` before the harness starts, :meth:`close` once it
    stopped (idempotent); :meth:`drain` hands the read loop what to publish."""

    def __init__(self, tools: RunTools, loop: EndpointLoop | None = None) -> None:
        self.tools = tools
        self.loop = loop or EndpointLoop.shared()
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._numbers = itertools.count(1)
        self.calls = 0
        """The calls the harness made this turn (counted into the run record's
        ``tool_calls``)."""
        self._in_flight: dict[str, float] = {}
        self._lock = threading.Lock()
        """Guards ``_in_flight``: a call ends on the loop's thread, close() on the turn's."""
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closed = False
        self._loaded: set[str] = set()
        """The attached servers the harness connected to: one it never reached is reported
        (a server the CLI failed to load is never silent)."""
        self._trace = tracing.capture()  # made in the turn's span: its calls' parent
        self._directory: int | None = None
        """The socket's directory while the socket is there."""
        self._own_directory: int | None = None
        """That directory when the endpoint opened it itself (it closes it)."""

    @property
    def busy(self) -> bool:
        """A call is waiting for its answer (the turn's idle clock stands still)."""
        return bool(self._in_flight)

    def open(self) -> None:
        """Bind and serve the socket (:class:`~sandbox.base.UnsafePath` when it cannot be made
        without following a link)."""
        tools = self.tools
        directory = tools.directory
        if directory is None:
            tools.socket_path.parent.mkdir(parents=True, exist_ok=True)
            directory = self._own_directory = safe_fs.open_root(tools.socket_path.parent)
        self._directory = directory
        try:
            listener = _bind(directory, tools.socket_path.name)
        except BaseException:
            self._remove_socket()
            raise
        self._server = self.loop.call(
            asyncio.start_unix_server(self._serve, sock=listener, limit=LINE_LIMIT)
        )
        log.info("tools.endpoint_opened", extra={"run_id": tools.run_id})

    def close(self) -> None:
        """Stop listening, end every connection, and answer the harness's waiting calls with
        a ``tool-result`` that says the turn ended."""
        if self._closed:
            return
        self._closed = True
        if self.tools.ask is not None:
            self.tools.ask.close()  # its denials are published before the terminal
        if self._server is not None:
            with contextlib.suppress(Exception):
                self.loop.call(self._shutdown())
        self._remove_socket()
        with self._lock:
            waiting, self._in_flight = dict(self._in_flight), {}
        for call_id, started in waiting.items():
            self._result(call_id, Reply(False, "the turn ended before the tool answered"), started)
        for name in self.tools.servers:
            if name not in self._loaded:
                self._events.put(
                    SandboxActivity(
                        kind="tool",
                        description=f"MCP server {name} was not loaded by the harness this "
                        "turn: it never reached the run's endpoint",
                    )
                )

    def _remove_socket(self) -> None:
        directory, self._directory = self._directory, None
        if directory is None:
            return
        try:
            safe_fs.unlink(directory, self.tools.socket_path.name)
        except FileNotFoundError:
            pass
        except UnsafePath as exc:
            log.warning("tools.socket_left", extra={"run_id": self.tools.run_id, "error": str(exc)})
        if directory == self._own_directory:
            os.close(directory)
            self._own_directory = None

    def put(self, event: Event) -> None:
        """Queue an event for the turn's stream (from any thread)."""
        self._events.put(event)

    def drain(self) -> list[Event]:
        events: list[Event] = []
        with contextlib.suppress(queue.Empty):
            while True:
                events.append(self._events.get_nowait())
        return events

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    # -- one connection ------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            opened = await self._handshake(reader, writer)
            if opened is not None:
                await self._speak(opened[0], opened[1], reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception:
            log.exception("tools.connection_failed", extra={"run_id": self.tools.run_id})
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[str, str] | None:
        """The connection's token and server, once accepted; None once refused."""
        try:
            line = await asyncio.wait_for(reader.readline(), HANDSHAKE_TIMEOUT_S)
            hello = json.loads(line[:HANDSHAKE_LIMIT]) if len(line) <= HANDSHAKE_LIMIT else None
        except (TimeoutError, ValueError):
            hello = None
        token = hello.get("token") if isinstance(hello, dict) else None
        server = hello.get("server") if isinstance(hello, dict) else None
        refusal = None
        if not isinstance(token, str) or not isinstance(server, str):
            refusal = 'the first line must be {"token": ..., "server": ...}'
        elif server not in self.tools.servers:
            refusal = f"server {server!r} is not attached to this run"
        elif not await anyio.to_thread.run_sync(self.tools.verify, token):
            refusal = "the run's credential was refused"
        if refusal is not None:
            log.warning(
                "tools.connection_refused", extra={"run_id": self.tools.run_id, "why": refusal}
            )
            self._events.put(
                SandboxActivity(
                    kind="tool",
                    description=f"the run's MCP endpoint refused a connection: {refusal}",
                )
            )
            writer.write(json.dumps({"ok": False, "error": refusal}).encode() + b"\n")
            await writer.drain()
            return None
        self._loaded.add(server)  # type: ignore[arg-type]
        writer.write(b'{"ok": true}\n')
        await writer.drain()
        assert isinstance(token, str) and isinstance(server, str)
        return token, server

    async def _speak(
        self, token: str, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        backend = self.tools.servers[name]

        async def list_tools(
            ctx: Any, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            try:
                listed = await anyio.to_thread.run_sync(backend.list_tools)
            except BackendError as exc:
                log.warning("tools.list_failed", extra={"server": name, "error": str(exc)})
                listed = []
            return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in listed])

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            reply = await self._call(token, name, backend, params.name, params.arguments or {})
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=reply.output)], is_error=not reply.ok
            )

        server: Server[Any] = Server(
            f"harness-{name}", on_list_tools=list_tools, on_call_tool=call_tool
        )
        async with stdio_server(_Lines(reader), _Writer(writer)) as (read, write):  # type: ignore[arg-type]
            await server.run(read, write, server.create_initialization_options())

    async def _call(
        self, token: str, name: str, backend: Backend, tool: str, arguments: dict[str, Any]
    ) -> Reply:
        tools = self.tools
        call_id = f"t{tools.turn}-{next(self._numbers)}"
        self.calls += 1
        text, size = shown_input(arguments, tools.masker)
        self._events.put(
            ToolCall(call_id=call_id, server=name, tool=tool, input=text, input_chars=size)
        )
        started = time.monotonic()
        with self._lock:
            room = len(self._in_flight) < tools.limits.in_flight
            if room:
                self._in_flight[call_id] = started
        if not room:
            reply = Reply(False, f"too many tool calls at once (at most {tools.limits.in_flight})")
        else:
            with tracing.tool_span(name, tool, call_id, parent=self._trace) as span:
                reply = await self._answer(token, name, backend, call_id, tool, arguments)
                span.set_attribute("harness.tool.ok", reply.ok)
            metrics.tool_called(name, tool, reply.ok, time.monotonic() - started)
            with self._lock:
                if self._in_flight.pop(call_id, None) is None:
                    return reply  # the turn ended meanwhile: close() published the result
        size = len(reply.output)
        reply = _cut(reply, tools.limits.result_max_chars)
        self._result(call_id, reply, started, size)
        return reply

    async def _answer(
        self,
        token: str,
        name: str,
        backend: Backend,
        call_id: str,
        tool: str,
        arguments: dict[str, Any],
    ) -> Reply:
        tools = self.tools
        if not await anyio.to_thread.run_sync(tools.verify, token):
            log.warning("tools.call_refused", extra={"run_id": tools.run_id, "server": name})
            return Reply(False, "the run's credential was refused: the call is not made")
        if tools.ask is not None:
            refused = await anyio.to_thread.run_sync(
                tools.ask, name, tool, arguments, abandon_on_cancel=True
            )
            if refused is not None:
                return Reply(False, refused)
        deadline = time.time() + tools.limits.timeout_s
        try:
            return await anyio.to_thread.run_sync(
                backend.call, call_id, tool, arguments, deadline, abandon_on_cancel=True
            )
        except BackendError as exc:
            return Reply(False, str(exc))

    def _result(self, call_id: str, reply: Reply, started: float, size: int | None = None) -> None:
        """``size``: of the tool's answer before the endpoint cut it for the harness."""
        output = self.tools.masker.mask(reply.output)
        self._events.put(
            ToolResult(
                call_id=call_id,
                ok=reply.ok,
                output=output[:TOOL_TEXT_LIMIT],
                output_chars=len(output) if size is None else size,
                duration_ms=int((time.monotonic() - started) * 1000),
            )
        )


def _cut(reply: Reply, limit: int) -> Reply:
    if len(reply.output) <= limit:
        return reply
    note = CUT_NOTE.format(size=len(reply.output), kept=limit)
    return Reply(reply.ok, reply.output[:limit] + note)


def _bind(directory: int, name: str) -> socket.socket:
    """A listening Unix socket at ``name`` in ``directory``, writable by the sandbox's user
    (the token is what guards it)."""
    listener = safe_fs.bind_socket(directory, name, 0o666)
    listener.listen(64)
    listener.setblocking(False)
    return listener


class _Lines:
    """The connection's lines, as the SDK's stdio transport reads a file."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    async def __aiter__(self) -> AsyncIterator[str]:
        while True:
            try:
                line = await self.reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                log.warning("tools.message_too_long")
                return
            if not line:
                return
            if line.strip():
                yield line.decode("utf-8", errors="replace")


class _Writer:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode())

    async def flush(self) -> None:
        await self.writer.drain()
