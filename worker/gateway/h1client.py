"""The gateway's HTTP/1.1 client to its upstreams: h11 writes the request and reads the
response's head; the body is then read off the connection with its framing undone by
:mod:`worker.gateway.body`, one piece per read (no parser's event per chunk on the way).

Connections (:mod:`worker.gateway.network`, TLS with the operator's context) are kept alive
per origin, as httpx's pool keeps them: at most :data:`MAX_IDLE` idle, each for at most
:data:`IDLE_S`, and reused only when quiet (a server that closed one has sent its end); at
most :data:`MAX_CONNECTIONS` at once, a request waiting :data:`POOL_S` for one. No redirect is
followed, no cookie kept, no header added but ``Host`` and ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import h11

from worker.gateway import network
from worker.gateway.body import BadBody, Body, body_for
from worker.gateway.network import READ_BYTES, Stream, UpstreamFailed

CONNECT_S, READ_S, WRITE_S, POOL_S = 15.0, 600.0, 60.0, 30.0
"""A model may think for minutes before its first byte; a connection is made in seconds."""
MAX_CONNECTIONS, MAX_IDLE, IDLE_S = 512, 64, 5.0
MAX_HEAD_BYTES = 100 * 1024
_Origin = tuple[str, str, int]


class H1Client:
    """Requests to any origin, over kept-alive connections (see the module's docstring)."""

    def __init__(self, pins: Mapping[str, str], context: ssl.SSLContext) -> None:
        self._pins = {name.lower().rstrip("."): ip for name, ip in pins.items()}
        self._context = context
        self._idle: dict[_Origin, list[tuple[Stream, float]]] = {}
        self._idle_count = 0
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def send(
        self, method: bytes, url: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> H1Response:
        """The response's head; its body is read with :meth:`H1Response.read`."""
        parts = urlsplit(url)
        try:
            port = parts.port or _PORTS[parts.scheme]
        except (ValueError, KeyError):
            port = 0
        if not port or not parts.hostname:
            raise UpstreamFailed(f"not an upstream URL: {url}")
        origin = (parts.scheme, parts.hostname, port)
        target = url[len(parts.scheme) + 3 + len(parts.netloc) :] or "/"
        netloc = parts.netloc
        if parts.port == _PORTS[parts.scheme]:  # the Host without the scheme's own port
            netloc = netloc.rpartition(":")[0]
        if not netloc.isascii():
            raise UpstreamFailed(f"not an ASCII host name: {netloc}")
        sent = [(b"host", netloc.encode()), *headers]
        if body or method in (b"POST", b"PUT", b"PATCH"):
            sent.append((b"content-length", b"%d" % len(body)))
        try:
            async with asyncio.timeout(POOL_S):
                await self._slots.acquire()
        except TimeoutError:
            raise UpstreamFailed(f"no connection free in {POOL_S:g} s") from None
        stream: Stream | None = None
        try:
            stream = self._reuse(origin) or await self._open(origin)
            conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
            try:
                data = conn.send(h11.Request(method=method, target=target, headers=sent)) or b""
                if body:
                    data += conn.send(h11.Data(data=body)) or b""
                data += conn.send(h11.EndOfMessage()) or b""
            except h11.LocalProtocolError as exc:
                raise UpstreamFailed(f"the request cannot be sent: {exc}") from None
            failed: UpstreamFailed | None = None
            try:
                await stream.write(data, WRITE_S)
            except UpstreamFailed as exc:  # it may have answered before taking it all
                failed = exc
            try:
                head = await _head(conn, stream)
            except UpstreamFailed:
                if failed is not None:
                    raise failed from None
                raise
        except BaseException:
            if stream is not None:
                stream.abort()
            self._slots.release()
            raise
        pending, _ = conn.trailing_data
        body_ = body_for(method, head.status_code, head.headers)
        return H1Response(self, origin, stream, head, body_, pending)

    def _reuse(self, origin: _Origin) -> Stream | None:
        now = asyncio.get_running_loop().time()
        for key, idle in list(self._idle.items()):  # what has waited too long goes
            while idle and now - idle[0][1] >= IDLE_S:
                idle.pop(0)[0].close()
                self._idle_count -= 1
            if not idle:
                del self._idle[key]
        kept = self._idle.get(origin, [])
        found: Stream | None = None
        while kept and found is None:
            stream, _ = kept.pop()
            self._idle_count -= 1
            if stream.idle_and_open:
                found = stream
            else:
                stream.close()
        if not kept:
            self._idle.pop(origin, None)
        return found

    async def _open(self, origin: _Origin) -> Stream:
        scheme, host, port = origin
        stream = await network.connect(host, port, pins=self._pins, timeout=CONNECT_S)
        if scheme == "https":
            stream = await stream.start_tls(self._context, host, CONNECT_S)
        return stream

    def release(self, origin: _Origin, stream: Stream, reusable: bool) -> None:
        """A response is done with its connection (kept for the next request if it may be)."""
        self._slots.release()
        if not reusable:
            stream.close()
            return
        self._idle.setdefault(origin, []).append((stream, asyncio.get_running_loop().time()))
        self._idle_count += 1
        if self._idle_count > MAX_IDLE:  # the longest idle goes
            key = min(self._idle, key=lambda k: self._idle[k][0][1])
            self._idle[key].pop(0)[0].close()
            self._idle_count -= 1
            if not self._idle[key]:
                del self._idle[key]


_PORTS = {"http": 80, "https": 443}


async def _head(conn: h11.Connection, stream: Stream) -> h11.Response:
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.read(READ_BYTES, READ_S))
            elif isinstance(event, h11.Response):
                return event
            elif not isinstance(event, h11.InformationalResponse):
                raise UpstreamFailed("the connection closed before an answer")
    except h11.RemoteProtocolError as exc:
        raise UpstreamFailed(f"the answer is not HTTP/1.1: {exc}") from None


def _keeps_alive(head: h11.Response) -> bool:
    if head.http_version != b"1.1":
        return False
    return not any(
        name == b"connection" and b"close" in (v.strip().lower() for v in value.split(b","))
        for name, value in head.headers
    )


class H1Response:
    """A response whose head has come; :meth:`read` its body, then :meth:`aclose`."""

    def __init__(
        self,
        client: H1Client,
        origin: _Origin,
        stream: Stream,
        head: h11.Response,
        body: Body,
        pending: bytes,
    ) -> None:
        self.status_code = head.status_code
        self.reason_phrase = head.reason.decode("latin-1")
        self.headers: list[tuple[bytes, bytes]] = list(head.headers.raw_items())
        self._client, self._origin, self._stream = client, origin, stream
        self._body, self._pending = body, pending
        self._keep = _keeps_alive(head) and not body.until_close
        self._closed = False

    async def read(self) -> bytes:
        """The body's next bytes (all that one read of the connection brought), or ``b""``
        at its end."""
        body = self._body
        try:
            while not body.done:
                if self._pending:
                    data, self._pending = self._pending, b""
                else:
                    data = await self._stream.read(READ_BYTES, READ_S)
                    if not data:
                        body.end()
                        break
                piece = body.feed(data)
                if piece:
                    return piece
        except BadBody as exc:
            self._keep = False
            raise UpstreamFailed(str(exc)) from None
        except BaseException:
            self._keep = False
            raise
        return b""

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        body = self._body
        reusable = self._keep and body.done and not body.extra and not self._pending
        self._client.release(self._origin, self._stream, reusable)
