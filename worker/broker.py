"""kombu's Redis transport, made to survive a broker restart while a turn is in flight.

With kombu 5.7, a Redis broker lost while a worker holds an unacknowledged turn (we ack late)
took the worker down: Celery closes the lost connection, kombu detaches the transport from
its connection (``transport.client = None``), and the channel's last duty, putting its
unacknowledged messages back in the queue, needs a Redis client built from the connection
parameters it just lost: ``AttributeError: 'NoneType' object has no attribute 'hostname'``,
"Unrecoverable error", warm shutdown. The ack of the turn that was running then failed the
same way. See celery/kombu#582 and #320 for the family of bugs.

Here a channel remembers its broker's parameters while it is connected. After the connection
is gone, the restore and late acks of its messages reach the broker with a fresh client: they
succeed once the broker is back, and while it is still down they fail with a connection
error, which kombu and Celery expect and ignore (the message then stays in the broker's
unacked index, and the visibility timeout sweep puts it back). The worker stays up.

``install()`` points kombu's ``redis`` and ``rediss`` aliases at this transport, so URLs,
Celery's banner and everything else keep their usual form; the worker process calls it.
A producer's app names the transport itself instead (``worker.app.create_producer_app``,
:func:`transport_for`), so its publishes share one Redis client too without a change to
kombu's aliases in the producer's process.
"""

from __future__ import annotations

from typing import Any

import kombu.transport
import redis
from kombu.transport import redis as kombu_redis

TRANSPORT = f"{__name__}:Transport"
SCHEMES = ("redis", "rediss")
"""The broker URL schemes this transport serves."""


class Channel(kombu_redis.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync_client: Any = None
        super().__init__(*args, **kwargs)
        self._broker_params: dict[str, Any] = super()._connparams(asynchronous=False)

    def _create_client(self, asynchronous: bool = False) -> Any:
        """kombu builds a new ``redis.Redis`` (~60 us: its reply callbacks) for every publish,
        ack and unacked-index write, three task events per turn among them. One client per
        pool does: a client is safe to share between threads, and each pipeline is its own."""
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is not None and transport.client is not None:
            return dict(super()._connparams(asynchronous=asynchronous))
        if asynchronous:  # only the event loop uses these; it has moved to a new channel
            raise redis.ConnectionError("the broker connection of this channel is closed")
        return dict(self._broker_params)


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """The transport an app names for this broker URL: ours for Redis, None (the URL's own)
    for any other broker."""
    scheme = broker_url.partition("://")[0].lower()
    return TRANSPORT if scheme in SCHEMES else None


def install() -> None:
    """Make ``redis://`` and ``rediss://`` broker URLs use this transport (idempotent)."""
    for scheme in SCHEMES:
        kombu.transport.TRANSPORT_ALIASES[scheme] = TRANSPORT
