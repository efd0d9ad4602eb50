"""``harness api``: the HTTP API (FastAPI), everything the Python client does, under ``/v1``.

Every run operation is :class:`~worker.client.HarnessClient`'s, called in the threadpool
(its methods block on synchronous Redis); only the event streams, the rate limit and the
ownership check talk to Redis from the event loop (``redis.asyncio``, one small pool, and
the :class:`~worker.api.sse.StreamHub`'s own connection). A run is its tenant's alone:
another tenant's run answers 404 on every endpoint, as an unknown one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from config import Settings, load_settings
from worker.api import errors, openapi, pages, routes, schedules, triggers, uploads, webhooks
from worker.api.limits import FailedAuthLimiter, RateLimiter, StreamSlots
from worker.api.middleware import AccessLog, SecurityHeaders
from worker.api.sse import StreamHub
from worker.api.tenants import TenantRegistry
from worker.api.webhooks import Dispatcher
from worker.client import HarnessClient
from worker.observe import logs, metrics, tracing
from worker.store.keys import Keys

log = logging.getLogger("worker.api")

POOL_CONNECTIONS = 8
"""The event loop's Redis connections at most (ownership checks, the rate limit, stream
backlogs, webhooks); the hub has one more of its own."""


@dataclass
class Api:
    """What the routes share: built by :func:`create_app`, connected by its lifespan."""

    settings: Settings
    keys: Keys
    client: HarnessClient
    tenants: TenantRegistry
    streams: StreamSlots
    pool: Any = None
    hub: StreamHub | None = None
    limiter: RateLimiter | None = None
    auth_failures: FailedAuthLimiter | None = None
    webhooks: Dispatcher | None = None
    drain_until: float | None = None
    """Once shutting down (:meth:`drain`): the monotonic time by which it is done."""

    def drain(self) -> None:
        """Shutting down: every event stream is told to reconnect and ends now, no webhook
        delivery starts, and those in flight have until :attr:`drain_until`
        (``HARNESS_API_DRAIN_S``) to finish."""
        if self.drain_until is None:
            self.drain_until = time.monotonic() + self.settings.api_drain_s
            log.info("api.draining", extra={"within_s": self.settings.api_drain_s})
        if self.hub is not None:
            self.hub.drain()
        if self.webhooks is not None:
            self.webhooks.draining = True


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyLimit:
    """413 for a body over ``limit`` bytes, by its Content-Length or as it is read; a run
    created with an archive (``POST /v1/runs``, multipart) may add ``archive`` bytes, and a
    run or turn with files (multipart) ``attachments`` bytes."""

    def __init__(self, app: Any, limit: int, archive: int = 0, attachments: int = 0) -> None:
        self.app = app
        self.limit = limit
        self.archive = archive
        self.attachments = attachments

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        limit = self.limit
        path = str(scope.get("path", ""))
        files = path == "/v1/runs" or (path.startswith("/v1/runs/") and path.endswith("/turns"))
        if (
            scope.get("method") == "POST"
            and files
            and uploads.is_multipart({"content-type": content_type})
        ):
            limit += self.archive if path == "/v1/runs" else 0
            limit += self.attachments
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await errors.respond(
                errors.ApiError(413, "too_large", f"the body is over {limit} bytes")
            )(scope, receive, send)
            return
        seen = 0

        async def limited() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise errors.ApiError(413, "too_large", f"the body is over {limit} bytes")
            return message

        await self.app(scope, limited, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()
    tracing.setup("harness-api")  # before its client: the process is the API
    state = Api(
        settings=settings,
        keys=Keys(settings.key_prefix),
        client=HarnessClient(settings),
        tenants=TenantRegistry(settings.tenants_file or None),
        streams=StreamSlots(settings.api_streams_per_tenant),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        metrics.serve(settings.api_metrics_port, settings.metrics_addr)
        pool = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(
                settings.redis_url,
                decode_responses=True,
                max_connections=POOL_CONNECTIONS,
                timeout=30,
            )
        )
        reader = aioredis.Redis.from_url(
            settings.redis_url, decode_responses=True, single_connection_client=True
        )
        http = webhooks.client(settings)
        state.pool = pool
        state.hub = StreamHub(reader, pool, state.keys, batch=settings.api_read_batch)
        state.limiter = RateLimiter(pool, state.keys, settings.api_rate_window_s)
        state.auth_failures = FailedAuthLimiter(
            pool, state.keys, settings.api_rate_window_s, settings.api_failed_auth_limit
        )
        state.webhooks = Dispatcher(pool, state.keys, state.tenants, settings, http)
        tasks = [
            asyncio.create_task(state.hub.run(), name="sse-hub"),
            asyncio.create_task(state.webhooks.run(), name="webhooks"),
        ]
        try:
            yield
        finally:
            state.drain()  # run by uvicorn alone (not harness api), the first word of it
            if state.webhooks is not None and state.drain_until is not None:
                await state.webhooks.finish(max(0.0, state.drain_until - time.monotonic()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await http.aclose()
            await reader.aclose()
            await pool.aclose()
            state.client.close()

    app = FastAPI(
        title="harness-worker",
        version="1",
        summary="Start, steer and watch coding-agent runs",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,  # a strict API: /v1/runs/ is no /v1/runs, and says 404
        generate_unique_id_function=openapi.operation_id,
        separate_input_output_schemas=False,  # one schema per model, as clients name it
    )
    app.state.api = state
    errors.install(app)
    app.include_router(routes.router)
    app.include_router(triggers.router)
    app.include_router(schedules.router)
    app.include_router(pages.router)
    if settings.api_cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.api_cors_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    app.add_middleware(
        BodyLimit,
        limit=settings.api_max_body_bytes,
        archive=settings.archive_max_bytes,
        attachments=settings.attach_max_total_bytes,
    )
    app.add_middleware(SecurityHeaders)
    app.add_middleware(AccessLog)  # outermost: it sees every answer, a 413 included
    openapi.install(app)
    return app


def serve(host: str, port: int) -> int:
    """Run the API in this process (``harness api``) until SIGTERM or SIGINT, then drain
    (:meth:`Api.drain`): no new connection, open event streams told to reconnect and closed,
    requests and webhook deliveries in flight given ``HARNESS_API_DRAIN_S`` in all."""
    import uvicorn

    app = create_app()
    state: Api = app.state.api
    settings = state.settings

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # Listening stops before the streams are told to reconnect: elsewhere, not here.
            for server in self.servers:
                server.close()
            state.drain()
            await super().shutdown(sockets)

    # Our lines (a request each, the stream reader's faults) and uvicorn's, one format;
    # uvicorn's access line is off: it would log query strings, ours does not.
    logs.configure(settings.log_format, logging.INFO)
    if not settings.tenants_file:
        log.warning("api.no_tenants: HARNESS_TENANTS_FILE is not set; every request is refused")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        log_level="info",
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=max(1, round(settings.api_drain_s)),
    )
    # uvicorn raises the signal again once it has shut down: SIGTERM then means "stopped".
    signal.signal(signal.SIGTERM, _stopped)
    DrainingServer(config).run()
    return 0


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
