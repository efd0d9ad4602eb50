"""What the API does around every request: security headers on each response, one log line
per request (the request body's bound is :class:`worker.api.app.BodyLimit`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger("worker.api")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

SECURITY_HEADERS: dict[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
"""On every response: no type sniffing, no framing (clickjacking the run page's Approve),
no Referer leaving a page of ours."""
DEFAULT_CSP = "default-src 'none'; frame-ancestors 'none'"
"""The Content-Security-Policy of a response that sets none (the run page sets its own,
with ``frame-ancestors 'none'`` too)."""
_CSP = b"content-security-policy"


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` and, where the response has none, :data:`DEFAULT_CSP`
    to every HTTP response (a 500 of the server-error handler gets them from
    :func:`worker.api.errors.install`: it answers outside the middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                present = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in self.headers if k not in present]
                if _CSP not in present:
                    headers.append((_CSP, DEFAULT_CSP.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, sending)


class AccessLog:
    """One ``api.request`` line at info per request, when its response ends (a stream's
    when it closes): method, path (without its query), status, duration, the client's
    address and, once authenticated, the tenant. Never a header (the key is one) nor the
    query string."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        status = 0

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            status = status or 500
            raise
        finally:
            client = scope.get("client")
            log.info(
                "api.request",
                extra={
                    "method": scope.get("method"),
                    "path": str(scope.get("path", ""))[:200],
                    "status": status,
                    "duration_ms": round((time.monotonic() - began) * 1000, 1),
                    "client": client[0] if client else None,
                    "tenant": (scope.get("state") or {}).get("tenant"),
                },
            )
