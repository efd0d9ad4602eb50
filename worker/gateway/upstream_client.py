"""The gateway's HTTP client to the upstreams: pooled, no redirect followed, the operator's
pinned names honoured and the operator's CA trusted.

A name ``HARNESS_EGRESS_HOSTS`` pins to an address (``name=ip``) is connected to at that
address, as the egress gateway does for the runs: the request keeps the name (its ``Host``,
TLS's server name and the certificate's check). ``HARNESS_MODEL_CA_FILE`` adds a CA to the
system's for the upstreams' certificates (a company's LLM proxy with an internal CA).

The client is the gateway's own (:mod:`worker.gateway.h1client`: a relayed stream costs a
fraction of httpx's CPU per read). A worker behind a proxy (the environment's proxy
variables, when no name is pinned) gets httpx's client instead, which honours them.
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx

from worker.gateway.h1client import (
    CONNECT_S,
    IDLE_S,
    MAX_CONNECTIONS,
    MAX_IDLE,
    POOL_S,
    READ_S,
    WRITE_S,
    H1Client,
)
from worker.gateway.network import UpstreamFailed

__all__ = ["UpstreamClient", "UpstreamFailed", "UpstreamResponse", "upstream_client"]


class UpstreamResponse(Protocol):
    """A response whose head has come."""

    status_code: int
    reason_phrase: str
    headers: list[tuple[bytes, bytes]]
    """As received (names in their own case)."""

    async def read(self) -> bytes:
        """The body's next bytes (framing undone), ``b""`` at its end; :class:`UpstreamFailed`
        when it broke off."""
        ...

    async def aclose(self) -> None: ...


class UpstreamClient(Protocol):
    async def send(
        self, method: bytes, url: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """The response's head (:class:`UpstreamFailed`: no answer)."""
        ...


class _HttpxResponse:
    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.reason_phrase = response.reason_phrase
        self.headers = list(response.headers.raw)
        self._response = response
        self._chunks: AsyncIterator[bytes] = response.aiter_raw()

    async def read(self) -> bytes:
        try:
            async for chunk in self._chunks:
                if chunk:
                    return chunk
        except httpx.HTTPError as exc:
            raise UpstreamFailed(str(exc) or type(exc).__name__) from exc
        return b""

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxClient:
    """httpx's client behind :class:`UpstreamClient` (the environment's proxies honoured)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def send(
        self, method: bytes, url: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        request = self._client.build_request(method.decode(), url, headers=headers, content=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamFailed(str(exc) or type(exc).__name__) from exc
        return _HttpxResponse(response)


def upstream_client(pins: Mapping[str, str], ca_file: str | None) -> UpstreamClient:
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    context.set_alpn_protocols(["http/1.1"])
    if pins or not urllib.request.getproxies():
        return H1Client(pins, context)
    return HttpxClient(
        httpx.AsyncClient(
            verify=context,
            timeout=httpx.Timeout(connect=CONNECT_S, read=READ_S, write=WRITE_S, pool=POOL_S),
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS,
                max_keepalive_connections=MAX_IDLE,
                keepalive_expiry=IDLE_S,
            ),
            follow_redirects=False,
        )
    )
