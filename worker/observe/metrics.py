"""Prometheus metrics of a worker process (prometheus-client), served on HARNESS_METRICS_PORT.

Every metric is per worker process and starts at zero when it starts; Prometheus sums them
over instances. Labels have small, closed value sets: harness ids, the contract's error
reasons (``internal`` included), event types, sandbox backends. The endpoint is started on
``worker_ready`` (worker/tasks.py) and serves ``/metrics`` in the text format; Flower goes on
serving Celery's task view beside it.

With the threads pool (the default) and the solo pool every turn runs in the process that
serves the endpoint. The prefork pool runs turns in child processes whose counters this
endpoint does not see: `harness doctor` says so.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

TURNS_STARTED = Counter(
    "harness_turns_started", "Turns whose harness this worker began to run.", ["harness"]
)
TURNS_COMPLETED = Counter(
    "harness_turns_completed", "Turns that ended with turn-complete.", ["harness"]
)
TURNS_FAILED = Counter(
    "harness_turns_failed",
    "Turns that ended with session-error, by the error's reason.",
    ["harness", "reason"],
)
TURN_DURATION = Histogram(
    "harness_turn_duration_seconds",
    "Wall time of a turn on this worker, from taking it to its terminal event.",
    ["harness", "outcome"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
)
TURNS_IN_FLIGHT = Gauge("harness_turns_in_flight", "Turns running on this worker now.", ["harness"])
EVENTS_PUBLISHED = Counter(
    "harness_events_published", "Events written to run streams, by event type.", ["type"]
)
PUBLISH_RETRIES = Counter(
    "harness_publish_retries", "Publish attempts that had to be retried (Redis unreachable)."
)
TEARDOWN_FAILURES = Counter(
    "harness_teardown_failures", "Run teardowns whose sandbox could not be removed."
)
CONTAINERS_REAPED = Counter(
    "harness_containers_reaped",
    "Sandboxes (containers, or local process groups) removed by the reaper.",
    ["backend"],
)


EGRESS_DENIED = Counter(
    "harness_egress_denied_total",
    "Connections of egress runs refused by the egress gateway, by harness and rule.",
    ["harness", "rule"],
)


# -- how turns wait and stop (docs/observability.md, "Metrics") -----------------------------

WAIT_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600)
QUEUE_WAIT = Histogram(
    "harness_turn_queue_wait_seconds",
    "From a turn's first send (or the reset a parked turn waited for) to a worker taking it.",
    ["harness"],
    buckets=WAIT_BUCKETS,
)
PARKS = Counter(
    "harness_parks",
    "Turns that met a rate limit or quota and parked their run, by the limit's reason.",
    ["harness", "reason"],
)
BUDGET_STOPS = Counter(
    "harness_budget_stops",
    "Turns a run's budget refused or stopped, by limit and when (before, during, after).",
    ["harness", "budget", "when"],
)
SLOT_WAITS = Counter(
    "harness_slot_waits", "Turns that began to wait for a concurrency slot of a key."
)
SLOT_WAIT = Histogram(
    "harness_slot_wait_seconds",
    "How long a turn waited for its keys' slots before it took them.",
    buckets=WAIT_BUCKETS,
)
PERMISSION_WAITS = Counter(
    "harness_permission_waits",
    "Permission requests that waited for an answer, by decision and who decided (person, "
    "or the worker's reason: worker:deadline, worker:cancelled, ...).",
    ["decision", "by"],
)
PERMISSION_WAIT = Histogram(
    "harness_permission_wait_seconds",
    "From a permission request to its decision.",
    ["decision"],
    buckets=WAIT_BUCKETS,
)
TOOL_CALLS = Counter(
    "harness_tool_calls",
    "Tool calls of the runs' MCP endpoints, by server (tool set), tool and outcome (ok, error).",
    ["server", "tool", "outcome"],
)
TOOL_CALL_DURATION = Histogram(
    "harness_tool_call_seconds",
    "From a tool call to its answer.",
    ["server"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300),
)
WEBHOOK_DELIVERIES = Counter(
    "harness_webhook_deliveries",
    "Webhook delivery attempts of the HTTP API, by outcome (delivered, failed, refused).",
    ["outcome"],
)
EVENT_STREAMS = Gauge(
    "harness_event_streams_open", "Server-Sent Event streams the HTTP API holds open now."
)


def queue_waited(harness: str, seconds: float) -> None:
    QUEUE_WAIT.labels(harness).observe(max(0.0, seconds))


def parked(harness: str, reason: str) -> None:
    PARKS.labels(harness, reason).inc()


def budget_stopped(harness: str, budget: str, when: str) -> None:
    """``when``: ``before`` (the turn was refused), ``during`` (the harness was stopped),
    ``after`` (the turn spent what was left: the next is refused)."""
    BUDGET_STOPS.labels(harness, budget, when).inc()


def slot_wait_began() -> None:
    SLOT_WAITS.inc()


def slot_taken_after(seconds: float) -> None:
    SLOT_WAIT.observe(max(0.0, seconds))


def permission_decided(decision: str, by: str, seconds: float) -> None:
    """A waiting permission request answered. ``by`` is cut to a closed set: the worker's
    and the rules' reasons as they are, any person as ``person``."""
    kind = ":".join(by.split(":", 2)[:2]) if by.startswith(("worker:", "rule:")) else "person"
    PERMISSION_WAITS.labels(decision, kind).inc()
    PERMISSION_WAIT.labels(decision).observe(max(0.0, seconds))


def tool_called(server: str, tool: str, ok: bool, seconds: float) -> None:
    TOOL_CALLS.labels(server, tool, "ok" if ok else "error").inc()
    TOOL_CALL_DURATION.labels(server).observe(max(0.0, seconds))


def webhook_delivered(outcome: str) -> None:
    """For the HTTP API's webhook sender: ``delivered`` (a 2xx), ``failed`` (to be retried),
    ``refused`` (a URL policy refuses)."""
    WEBHOOK_DELIVERIES.labels(outcome).inc()


def event_stream_opened() -> None:
    EVENT_STREAMS.inc()


def event_stream_closed() -> None:
    EVENT_STREAMS.dec()


def egress_denied(harness: str, rules: Iterable[str]) -> None:
    for rule, count in collections.Counter(rules).items():
        EGRESS_DENIED.labels(harness, rule).inc(count)


def turn_started(harness: str) -> float:
    """Count a turn in; returns the start time to hand to :func:`turn_finished`."""
    TURNS_STARTED.labels(harness).inc()
    TURNS_IN_FLIGHT.labels(harness).inc()
    return time.monotonic()


def turn_finished(harness: str, outcome: str, started: float) -> None:
    """Count a turn out. ``outcome`` is execute_turn's label for a turn it claimed:
    ``completed`` or ``failed:<reason>``."""
    TURNS_IN_FLIGHT.labels(harness).dec()
    if outcome == "completed":
        TURNS_COMPLETED.labels(harness).inc()
    else:
        TURNS_FAILED.labels(harness, outcome.removeprefix("failed:")).inc()
    TURN_DURATION.labels(harness, "completed" if outcome == "completed" else "failed").observe(
        time.monotonic() - started
    )


def turn_failed(harness: str, reason: str) -> None:
    """A turn closed without running here (its worker was lost, its host is gone)."""
    TURNS_FAILED.labels(harness or "unknown", reason).inc()


def events_published(types: Iterable[str]) -> None:
    # One increment per event type and batch: a flood publishes thousands per batch.
    for kind, count in collections.Counter(types).items():
        EVENTS_PUBLISHED.labels(kind).inc(count)


def publish_retried() -> None:
    PUBLISH_RETRIES.inc()


def teardown_failed() -> None:
    TEARDOWN_FAILURES.inc()


def reaped(backend: str) -> None:
    CONTAINERS_REAPED.labels(backend).inc()


def serve(port: int, addr: str = "127.0.0.1") -> bool:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread. Port 0 means off. This
    machine only unless HARNESS_METRICS_ADDR says wider (a run on network ``host`` shares
    this machine's loopback: such runs are the operator's explicit choice).

    A port already in use (several workers on one machine with the same setting) is logged
    and the worker runs on without metrics: give each worker its own HARNESS_METRICS_PORT.
    """
    if port <= 0:
        return False
    try:
        start_http_server(port, addr=addr)
    except OSError as exc:
        log.warning(
            "metrics.unavailable",
            extra={
                "port": port,
                "error": str(exc),
                "fix": "give each worker on this machine its own HARNESS_METRICS_PORT, or 0",
            },
        )
        return False
    log.info("metrics.serving", extra={"addr": addr, "port": port})
    return True
