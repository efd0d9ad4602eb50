"""The gateway's connections to its upstreams, on asyncio's own transports.

The transport keeps reading, :data:`READ_BYTES` at a time, into a bounded buffer of this
module's protocol (reading pauses at :data:`HIGH_WATER` bytes held, so a slow reader leaves
the rest in the kernel's socket buffers); a read takes everything buffered up to its size at
once, and a timeout is a timer armed only when a read has to wait. No cancel scope per read,
and the socket stays on the selector between reads while the reader keeps up (anyio, under
httpx, took it off and put it back each time: two ``epoll_ctl`` calls a read).

A name in ``pins`` is connected to at its address (``HARNESS_EGRESS_HOSTS``); TLS keeps the
name (its server name and the certificate's check).
"""

from __future__ import annotations

import asyncio
import math
import select
import socket
import ssl
import threading
from collections import deque
from collections.abc import Mapping

READ_BYTES = 65536
"""What one read of the socket takes at most (asyncio's own would take 256 KiB)."""
HIGH_WATER = 65536
"""Bytes held unread at which the transport stops reading (until fewer are held): at most
two reads' worth held per connection."""
HAPPY_EYEBALLS_S = 0.25


class UpstreamFailed(Exception):
    """The upstream could not be reached, or broke off (the message says which)."""


class _Protocol(asyncio.BufferedProtocol):
    """What the transport received and not yet read, and whether it may write."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.offset = 0
        """Where the first chunk's unread bytes begin."""
        self.size = 0
        self.eof = False
        self.error: BaseException | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.waiter: asyncio.Future[bool] | None = None
        self.deadline = math.inf
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(_read_buffer()[:nbytes])
        self.chunks.append(data)
        self.size += len(data)
        if self.size >= HIGH_WATER and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def wait(self, timeout: float | None) -> bool:
        """Until something happens (data, the end, room to write); False when ``timeout``
        passed first."""
        waiter: asyncio.Future[bool] = self.loop.create_future()
        self.waiter = waiter
        if timeout is None:
            self.deadline = math.inf
        else:
            # One timer per connection, moved on lazily: a wait per frame of a stream arms
            # none of its own.
            self.deadline = self.loop.time() + timeout
            if self._timer is None:
                self._timer = self.loop.call_at(self.deadline, self._expire)
        try:
            return await waiter
        finally:
            self.waiter = None

    def _expire(self) -> None:
        self._timer = None
        waiter = self.waiter
        if waiter is None or waiter.done() or self.deadline == math.inf:
            return  # the next wait with a timeout arms it again
        if self.loop.time() < self.deadline:  # a later wait's
            self._timer = self.loop.call_at(self.deadline, self._expire)
            return
        self.waiter = None
        waiter.set_result(False)

    def take(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of what arrived (at least one byte held), in one piece."""
        chunks, offset = self.chunks, self.offset
        first = chunks[0]
        if len(first) - offset > max_bytes:
            data = first[offset : offset + max_bytes]
            self.offset = offset + max_bytes
        else:
            parts = [first[offset:] if offset else chunks.popleft()]
            if offset:
                chunks.popleft()
            self.offset = 0
            size = len(parts[0])
            while chunks and size + len(chunks[0]) <= max_bytes:
                part = chunks.popleft()
                parts.append(part)
                size += len(part)
            data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.size -= len(data)
        if self.reading_paused and self.size < HIGH_WATER and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return data


class Stream:
    """One connection: bytes in (:meth:`read`), bytes out (:meth:`write`)."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport, self._protocol = transport, protocol

    async def read(self, max_bytes: int, timeout: float | None) -> bytes:
        """What arrived, up to ``max_bytes`` (waiting for something); ``b""`` at the end."""
        protocol = self._protocol
        while not protocol.chunks:
            if protocol.eof:
                if protocol.error is not None:
                    raise UpstreamFailed(f"the connection broke: {_why(protocol.error)}")
                return b""
            if not await protocol.wait(timeout):
                raise UpstreamFailed(f"nothing received in {timeout:g} s")
        return protocol.take(max_bytes)

    async def write(self, data: bytes, timeout: float | None) -> None:
        """``data`` sent, or in the transport's buffer below its limit."""
        protocol = self._protocol
        if protocol.eof or self._transport.is_closing():
            raise UpstreamFailed("the connection is closed")
        self._transport.write(data)
        while protocol.writing_paused:
            if protocol.eof:
                raise UpstreamFailed("the connection is closed")
            if not await protocol.wait(timeout):
                raise UpstreamFailed(f"nothing taken in {timeout:g} s")

    async def start_tls(
        self, context: ssl.SSLContext, server_hostname: str, timeout: float | None
    ) -> Stream:
        """The same connection, over TLS (this stream is not used again)."""
        try:
            transport = await self._protocol.loop.start_tls(
                self._transport,
                self._protocol,
                context,
                server_hostname=server_hostname,
                ssl_handshake_timeout=timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            self._transport.abort()
            raise UpstreamFailed(f"TLS with {server_hostname}: {_why(exc)}") from exc
        if not isinstance(transport, asyncio.Transport):
            self._transport.abort()
            raise UpstreamFailed(f"TLS with {server_hostname}: the connection closed")
        self._protocol.transport = transport
        return Stream(transport, self._protocol)

    @property
    def idle_and_open(self) -> bool:
        """Whether a kept-alive connection may carry another request: nothing unread, no
        end (a server closing an idle connection sends one), the socket open and quiet."""
        protocol = self._protocol
        if protocol.chunks or protocol.eof or self._transport.is_closing():
            return False
        sock = self._transport.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return False
        poll = select.poll()
        poll.register(sock.fileno(), select.POLLIN)
        return not poll.poll(0)

    def close(self) -> None:
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()


async def connect(
    host: str, port: int, *, pins: Mapping[str, str], timeout: float | None
) -> Stream:
    """A TCP connection to ``host`` (at its pinned address, if it has one)."""
    loop = asyncio.get_running_loop()
    address = pins.get(host.lower().rstrip("."), host)
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await loop.create_connection(
                lambda: _Protocol(loop), address, port, happy_eyeballs_delay=HAPPY_EYEBALLS_S
            )
    except TimeoutError as exc:
        raise UpstreamFailed(f"connecting to {host}:{port} took over {timeout:g} s") from exc
    except OSError as exc:
        raise UpstreamFailed(f"connecting to {host}:{port}: {_why(exc)}") from exc
    assert isinstance(transport, asyncio.Transport)
    sock = transport.get_extra_info("socket")
    if sock is not None:  # asyncio sets it only when the address info named TCP
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Stream(transport, protocol)


_local = threading.local()


def _read_buffer() -> memoryview:
    """The thread's buffer a socket is read into (and copied out of at once: asyncio asks
    for it and says what it filled in the same call), one per thread, not per connection."""
    buffer: memoryview | None = getattr(_local, "buffer", None)
    if buffer is None:
        buffer = _local.buffer = memoryview(bytearray(READ_BYTES))
    return buffer


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
