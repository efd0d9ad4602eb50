"""The gateway's HTTP client to the upstreams: pooled, no redirect followed, the operator's
pinned names honoured and the operator's CA trusted.

A name ``HARNESS_EGRESS_HOSTS`` pins to an address (``name=ip``) is connected to at that
address, as the egress gateway does for the runs: the request keeps the name (its ``Host``,
TLS's server name and the certificate's check). ``HARNESS_MODEL_CA_FILE`` adds a CA to the
system's for the upstreams' certificates (a company's LLM proxy with an internal CA). The
environment's proxy variables apply as for any httpx client (a worker behind a proxy).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping

import httpcore
import httpx

TIMEOUT = httpx.Timeout(connect=15.0, read=600.0, write=60.0, pool=30.0)
"""A model may think for minutes before its first byte; a connection is made in seconds."""


class PinnedNames(httpcore.AsyncNetworkBackend):
    """httpcore's network backend connecting a pinned name to its address."""

    def __init__(self, pins: Mapping[str, str]) -> None:
        self._pins = {name.lower().rstrip("."): address for name, address in pins.items()}
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = self._pins.get(host.lower().rstrip("."), host)
        return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("an upstream is reached over TCP")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Transport(httpx.AsyncHTTPTransport):
    def __init__(self, pins: Mapping[str, str], verify: ssl.SSLContext) -> None:
        super().__init__(verify=verify)
        # httpx takes no network backend of its own; its pool does: made as httpx makes it,
        # with ours.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=verify,
            max_connections=512,
            max_keepalive_connections=64,
            network_backend=PinnedNames(pins),
        )


def upstream_client(pins: Mapping[str, str], ca_file: str | None) -> httpx.AsyncClient:
    verify = ssl.create_default_context()
    if ca_file:
        verify.load_verify_locations(cafile=ca_file)
    if not pins:
        return httpx.AsyncClient(
            verify=verify,
            timeout=TIMEOUT,
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
            follow_redirects=False,
        )
    return httpx.AsyncClient(
        transport=_Transport(pins, verify), timeout=TIMEOUT, follow_redirects=False
    )
