"""The model gateway's HTTP side: one turn's requests in, the run's upstream out.

Each connection (from the relay in the sandbox, or a local harness) speaks HTTP/1.1, parsed
by h11. A request is refused before it goes anywhere when the turn may make no more
(:meth:`Hooks.refusal`: the turn is over, its credential revoked, a budget spent), when its
target is outside the run's upstream, when its body is over the limit, or when it carries no
stand-in of the turn (or one of another). Otherwise its stand-ins are swapped for the real keys
(:mod:`worker.gateway.standins`), it is sent upstream (:mod:`worker.gateway.upstream_client`),
and the response comes back as it arrives: what each read of the upstream brought is written
to the harness at once, in one piece (never the whole body held: the upstream is read at most
a read or two ahead of what the harness takes), and fed to a
:class:`~worker.gateway.wire.Meter` on the way for usage and the served model.

A primary model that fails (5xx, 529; 429 only when asked) before its response begins is
asked again as the next fallback model, the same request with the model changed
(:func:`~worker.gateway.wire.with_model`); the harness sees one response.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import h11
import orjson

from worker.gateway import wire
from worker.gateway.echo import EchoMask
from worker.gateway.standins import StandIns
from worker.gateway.upstream_client import UpstreamClient, UpstreamFailed, UpstreamResponse
from worker.gateway.upstreams import Upstream

log = logging.getLogger(__name__)

READ_BYTES = 65536
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"accept-encoding",
    }
)
"""Request headers not passed on as they came: hop-by-hop ones, and those the client sets from
the request it sends (the host, the length; the encoding asked for is identity, so that the
meter reads what passes)."""
RESPONSE_DROPPED = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"trailer"})


@dataclass(frozen=True)
class Refusal:
    """Why the gateway answers a request itself: its status, a code and a message the CLI
    shows."""

    status: int
    code: str
    message: str


class Hooks(Protocol):
    """What the turn's route decides and learns (called on the gateway's loop: never blocks)."""

    def refusal(self) -> Refusal | None: ...

    def metered(self, exchange: wire.Exchange, fallback_from: str | None) -> None: ...

    def fell_back(self, model: str, status: int, next_model: str) -> None: ...

    def refused(self, refusal: Refusal) -> None: ...


@dataclass(frozen=True)
class Policy:
    """One turn's route: where requests go, with what, and within which bounds."""

    upstream: Upstream
    standins: StandIns
    request_max_bytes: int
    max_connections: int = 32
    """Connections the turn may hold open at once; one more is answered 503 and closed."""
    fallback_models: tuple[str, ...] = ()
    fallback_on_429: bool = False
    pins: Mapping[str, str] = field(default_factory=dict)
    """Names the operator pins to addresses (HARNESS_EGRESS_HOSTS)."""
    ca_file: str | None = None
    """A CA the upstreams' certificates may chain to besides the system's."""


class _TooLarge(Exception):
    pass


class ModelProxy:
    """Serves one turn's connections (:meth:`serve`) for :class:`Policy` and :class:`Hooks`."""

    def __init__(self, policy: Policy, hooks: Hooks, client: UpstreamClient) -> None:
        self.policy, self.hooks, self.client = policy, hooks, client
        self.open = 0
        """Connections being served now."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.policy.max_connections:
            await _turn_away(writer, self.policy.max_connections)
            return
        self.open += 1
        try:
            await self._serve(reader, writer)
        finally:
            self.open -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=READ_BYTES)
        try:
            while True:
                event = await _next(conn, reader)
                if not isinstance(event, h11.Request):
                    break
                try:
                    body = await _body(conn, reader, self.policy.request_max_bytes)
                except _TooLarge:
                    await self._refuse(
                        conn,
                        writer,
                        Refusal(
                            413,
                            "request_too_large",
                            "harness-worker model gateway: the request body is over "
                            f"{self.policy.request_max_bytes} bytes "
                            "(HARNESS_MODEL_REQUEST_MAX_BYTES)",
                        ),
                        close=True,
                    )
                    break
                await self._handle(conn, writer, event, body)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("gateway.connection_failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        refusal = self.hooks.refusal()
        if refusal is not None:
            await self._refuse(conn, writer, refusal)
            return
        target = request.target.decode("latin-1")
        url = self.policy.upstream.target(target)
        if url is None:
            await self._refuse(
                conn,
                writer,
                Refusal(
                    404,
                    "not_the_upstream",
                    f"harness-worker model gateway: {target.split('?', 1)[0]} is not under the "
                    f"run's upstream ({self.policy.upstream.path or '/'})",
                ),
            )
            return
        headers, swapped, foreign = self._swap(request.headers)
        path, _, query = url.partition("?")
        if query:
            query, more, other = self.policy.standins.swap_query(query)
            swapped, foreign = swapped + more, foreign + other
            url = f"{path}?{query}"
        if foreign or not swapped:
            why = "a credential of another run" if foreign else "no credential of this run"
            await self._refuse(
                conn,
                writer,
                Refusal(401, "no_run_credential", f"harness-worker model gateway: {why}"),
            )
            return
        await self._forward(conn, writer, request.method, url, headers, body)

    def _swap(
        self, raw: Sequence[tuple[bytes, bytes]]
    ) -> tuple[list[tuple[bytes, bytes]], int, int]:
        standins = self.policy.standins
        headers: list[tuple[bytes, bytes]] = [(b"accept-encoding", b"identity")]
        swapped = foreign = 0
        for name, value in raw:
            if name in HOP_BY_HOP:
                continue
            value, ours, other = standins.swap_header(value)
            swapped, foreign = swapped + ours, foreign + other
            headers.append((name, value))
        return headers, swapped, foreign

    async def _forward(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        method: bytes,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        path, mark, query = url.partition("?")
        api = wire.api_of(path)
        parsed = _json_body(headers, body) if api is not None and wire.is_model_call(path) else None
        model = wire.requested_model(api, path, parsed) if api and parsed is not None else None
        if api == "chat" and parsed is not None and _usage_unasked(parsed):
            # A streamed chat completion says its usage only when asked: asked, so that the
            # wire is metered (a client reads the extra last chunk, which has no choices).
            options = parsed.get("stream_options")
            parsed = {
                **parsed,
                "stream_options": {**(options if isinstance(options, dict) else {}),
                                   "include_usage": True},
            }  # fmt: skip
            body, headers = orjson.dumps(parsed), _plain_json(headers)
        left = [m for m in self.policy.fallback_models if m != model] if model else []
        fallback_from: str | None = None
        while True:
            try:
                response = await self.client.send(method, path + mark + query, headers, body)
            except UpstreamFailed as exc:
                reason = str(exc) or type(exc).__name__
                origin = self.policy.upstream.origin
                message = f"the upstream {origin} did not answer: {reason}"
                await self._refuse(
                    conn,
                    writer,
                    Refusal(
                        502, "upstream_unreachable", f"harness-worker model gateway: {message}"
                    ),
                )
                return
            if not left or not self._falls_back(response.status_code):
                await self._relay(conn, writer, response, api, model, fallback_from)
                return
            await response.aclose()
            assert api is not None and parsed is not None and model is not None
            next_model = left.pop(0)
            self.hooks.fell_back(model, response.status_code, next_model)
            fallback_from = fallback_from or model
            path, parsed = wire.with_model(api, path, parsed, next_model)
            model, body = next_model, orjson.dumps(parsed)
            headers = _plain_json(headers)

    def _falls_back(self, status: int) -> bool:
        return wire.fallback_worthy(status) or (status == 429 and self.policy.fallback_on_429)

    async def _relay(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        response: UpstreamResponse,
        api: wire.API | None,
        model: str | None,
        fallback_from: str | None,
    ) -> None:
        lowered = _lowered(response.headers)
        meter = wire.Meter(api, response.status_code, lowered, model)
        metered = False
        echo = EchoMask(self.policy.standins.real_values)
        out_headers = [
            (k, echo.header(v)) for k, v in response.headers if k.lower() not in RESPONSE_DROPPED
        ]
        try:
            writer.write(
                conn.send(
                    h11.Response(
                        status_code=response.status_code,
                        headers=out_headers,
                        reason=response.reason_phrase.encode("latin-1", "replace"),
                    )
                )
                or b""
            )
            # Counted before the harness has the end (the last byte of a body of known length,
            # or the chunked terminator): what the turn does next sees the count.
            left = _length(lowered)
            while chunk := await response.read():
                meter.feed(chunk)
                if left is not None:
                    left -= len(chunk)
                    if left <= 0 and not metered:
                        metered = True
                        self.hooks.metered(meter.finish(), fallback_from)
                masked = echo.feed(chunk)
                if masked:
                    writer.write(conn.send(h11.Data(data=masked)) or b"")
                    await writer.drain()
            if not metered:
                metered = True
                self.hooks.metered(meter.finish(), fallback_from)
            rest = echo.flush()
            if rest:
                writer.write(conn.send(h11.Data(data=rest)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        except (UpstreamFailed, h11.LocalProtocolError) as exc:
            # The upstream broke off mid-body: the harness's connection is closed unfinished,
            # as the upstream's was (it sees a truncated response, not a made-up end).
            log.info("gateway.upstream_broke_off", extra={"error": str(exc)})
            conn.send_failed()
        finally:
            await response.aclose()
            if not metered:
                self.hooks.metered(meter.finish(), fallback_from)

    async def _refuse(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        refusal: Refusal,
        *,
        close: bool = False,
    ) -> None:
        self.hooks.refused(refusal)
        data = error_body(refusal)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
        if close:
            headers.append((b"connection", b"close"))
        writer.write(conn.send(h11.Response(status_code=refusal.status, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=data)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()


async def _turn_away(writer: asyncio.StreamWriter, limit: int) -> None:
    """A connection over the turn's limit: 503 at once, closed, nothing read."""
    body = error_body(
        Refusal(
            503,
            "too_many_connections",
            f"harness-worker model gateway: this turn holds {limit} connections open already "
            "(HARNESS_MODEL_MAX_CONNECTIONS)",
        )
    )
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    with contextlib.suppress(Exception):
        writer.write(head + body)
        await writer.drain()
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


def error_body(refusal: Refusal) -> bytes:
    """An error every vendor's client can read: Anthropic's ``{"type":"error","error":{…}}``,
    OpenAI's and Gemini's ``{"error":{"message",…}}`` are the same object here."""
    return orjson.dumps(
        {
            "type": "error",
            "error": {
                "type": refusal.code,
                "code": refusal.code,
                "message": refusal.message,
                "status": refusal.code.upper(),
            },
        }
    )


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await reader.read(READ_BYTES)
        conn.receive_data(data)
        if not data and conn.their_state is h11.IDLE:
            return None


async def _body(conn: h11.Connection, reader: asyncio.StreamReader, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        event = await _next(conn, reader)
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > limit:
                raise _TooLarge
            parts.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        else:
            raise h11.RemoteProtocolError("the request ended before its body")


def _json_body(headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any] | None:
    """The request's JSON object (decompressed when it came gzip or deflate), or None."""
    encoding = next((v.lower() for k, v in headers if k == b"content-encoding"), b"")
    try:
        if encoding == b"gzip":
            body = gzip.decompress(body)
        elif encoding == b"deflate":
            body = zlib.decompress(body)
        elif encoding not in (b"", b"identity"):
            return None
        parsed = orjson.loads(body)
    except (ValueError, OSError, zlib.error):
        return None
    return parsed if isinstance(parsed, dict) else None


def _lowered(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Header names lower-cased, a repeated one's values joined."""
    lowered: dict[str, str] = {}
    for raw, value in headers:
        name, text = raw.decode("latin-1").lower(), value.decode("latin-1")
        lowered[name] = f"{lowered[name]}, {text}" if name in lowered else text
    return lowered


def _length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def _usage_unasked(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    return body.get("stream") is True and not asked


def _plain_json(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers for a body sent again as plain JSON (the client sets its length)."""
    kept = [(k, v) for k, v in headers if k not in (b"content-encoding", b"content-type")]
    return [*kept, (b"content-type", b"application/json")]
