"""The Celery app ``worker.app``, and every Celery setting we use, in this one module.

Ack policy: turns are acknowledged late (after they finish) so a turn whose worker dies is
delivered again; a redelivered turn is made harmless by ``worker.turn.execute`` (a turn-started mark
in Redis means the harness never runs twice, and an orphaned turn gets one ``worker-lost``
terminal). The broker's visibility timeout is set above the longest turn a producer may ask
for, so a slow turn is never redelivered while it still runs. Prefetch is 1 per pool slot:
turns are long, and a prefetched turn would wait behind a busy one.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.entity import Exchange, Queue

from adapters import HARNESS_IDS
from config import Settings, get_settings
from worker import broker
from worker.app_names import TASK_REAP, TASK_RUN_TURN, harness_queue
from worker.observe import tracing
from worker.store.queued import SendTurn


def direct_queue(name: str) -> Queue:
    """A queue bound to an exchange of its own name by its own name, as a producer's
    ``send_task(queue=name)`` addresses it. A bare ``Queue(name)`` would be bound to the
    default exchange and routing key, so every message sent there would be copied into every
    such queue."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    consumed = settings.harness_queues or HARNESS_IDS
    prefix = settings.key_prefix
    # The worker adds its host queues when it starts (worker/tasks.py): they name where its
    # sandboxes live, which only a worker asks (the Docker daemon's ID).
    queues = [direct_queue(harness_queue(h, prefix)) for h in consumed]
    app = Celery("harness-worker", broker=settings.broker_url, include=["worker.tasks"])
    app.conf.update(
        task_queues=queues,
        task_default_queue=harness_queue("stdio-json", prefix),
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        task_track_started=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        worker_prefetch_multiplier=1,
        worker_pool=settings.pool,
        worker_concurrency=settings.concurrency,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_s,
            # A worker killed while it held kombu's restore mutex would block the return of
            # every killed worker's unacknowledged turns for the default 300 s; a sweep takes
            # milliseconds. Restore more per sweep: one Redis may serve many deployments.
            "unacked_mutex_expire": 30,
            "unacked_restore_limit": 100,
            "socket_connect_timeout": 5,
        },
        beat_schedule={
            "reap": {"task": TASK_REAP, "schedule": settings.reap_interval_s},
        },
        timezone="UTC",
    )
    if tracing.enabled():
        _instrument_celery()
    return app


def _instrument_celery() -> None:
    """Celery's publish and consume as spans, the trace context in the message's headers (the
    kept instrumentation; once per process, for every app)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()


def create_producer_app(settings: Settings | None = None) -> Celery:
    """The app a producer sends turns with: :func:`create_app`, its Redis broker connections
    through worker.broker's transport named by the app itself (``broker_transport``), so its
    publishes share one Redis client (kombu's builds one per message, ~0.3 ms here) while
    kombu's aliases, which only the worker process changes (``install``), stay as they are
    for the producer's own Celery apps. The worker's app leaves the setting unset: named,
    the transport would stand in Celery's banner in place of the broker URL's scheme."""
    app = create_app(settings)
    app.conf.broker_transport = broker.transport_for(app.conf.broker_url)
    return app


def turn_sender(app: Celery) -> SendTurn:
    """The one way a turn is sent to the broker: ``harness.run_turn`` with its payload, to a
    queue, delivered after ``countdown`` seconds (0: now)."""

    def send(payload: dict[str, Any], queue: str, countdown: float) -> None:
        app.send_task(TASK_RUN_TURN, args=[payload], queue=queue, countdown=countdown or None)

    return send


FLOWER_ADDRESS = "127.0.0.1"
"""Where ``celery -A worker.app flower`` listens unless told otherwise (``--address``,
``FLOWER_ADDRESS``, a ``flowerconfig.py``): Flower shows every task's arguments, prompts
included, and has no authentication of its own."""


def _flower_defaults() -> None:
    """Flower reads no Celery setting: its options are tornado's, defined when celery loads
    its command plugin (before ``-A`` loads this app), so its default address is set there."""
    try:
        from tornado.options import options
    except ImportError:  # no Flower installed, nothing to set
        return
    if "address" in options and not options.address:
        options.address = FLOWER_ADDRESS


_worker_app: Celery | None = None


def __getattr__(name: str) -> Celery:
    """``worker.app.app``, the worker's app (``celery -A worker.app``), is built on first use:
    a producer that imports this module for :func:`create_app` gets no side effect."""
    global _worker_app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _worker_app is None:
        broker.install()  # a broker restart must not take a worker with a turn in flight down
        _flower_defaults()
        tracing.setup("harness-worker")
        _worker_app = create_app()
    return _worker_app
