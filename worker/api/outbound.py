"""HTTP to hosts a tenant names (webhook receivers): each connection is made to an address
checked on the very lookup it uses.

A host's name is resolved once, per connection, in threads of our own (a slow resolver holds
none of the API's); every address must be public (:func:`sandbox.addresses.check_public`)
unless the operator names the host (``HARNESS_WEBHOOK_HOSTS``); the connection then goes to
one of those addresses, never to the name: a second lookup, which a rebinding DNS server
answers with a private address, never happens. The request keeps the name: the ``Host``
header is the URL's, and TLS is negotiated and its certificate verified for the name (SNI),
so pinning the address weakens nothing.

No proxy is used (the environment's ``HTTP(S)_PROXY`` included): the check is of the host
the request goes to.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor

import httpcore
import httpx

from sandbox import addresses


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend that resolves, checks and connects to the checked address
    (:class:`addresses.AddressRefused` escapes ``connect_tcp`` untranslated, so the caller
    can tell a refused host from a network fault)."""

    def __init__(self, named: Collection[str], resolvers: int) -> None:
        self._named = {h.lower().rstrip(".") for h in named}
        self._inner = httpcore.AnyIOBackend()
        self._resolver = ThreadPoolExecutor(resolvers, thread_name_prefix="webhook-dns")

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            found = await asyncio.wait_for(
                loop.run_in_executor(self._resolver, addresses.resolve, host, port), timeout
            )
        except addresses.Unresolvable as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host!r} timed out") from exc
        if host.lower().rstrip(".") not in self._named:
            addresses.check_public(host, found)
        failure: Exception | None = None
        for address in found:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # resolve() returns at least one address
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks go over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)

    def close(self) -> None:
        self._resolver.shutdown(wait=False, cancel_futures=True)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a :class:`PinnedBackend`."""

    def __init__(
        self,
        named: Collection[str],
        *,
        connections: int,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        super().__init__(verify=verify, trust_env=False)
        self.backend = PinnedBackend(named, connections)
        # httpx takes no network backend of its own; its connection pool does. The pool is
        # made as httpx makes it (``AsyncHTTPTransport.__init__``), with ours, and without
        # keep-alive: a reply left unread closes its connection anyway.
        ssl_context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=connections,
            max_keepalive_connections=0,
            network_backend=self.backend,
        )

    async def aclose(self) -> None:
        await super().aclose()
        self.backend.close()


def webhook_client(
    named: Collection[str], *, connections: int, verify: ssl.SSLContext | bool = True
) -> httpx.AsyncClient:
    """The API's client for webhook deliveries: pinned connections, no redirect followed, no
    proxy, at most ``connections`` open at once."""
    return httpx.AsyncClient(
        transport=PinnedTransport(named, connections=connections, verify=verify),
        follow_redirects=False,
        trust_env=False,
    )
