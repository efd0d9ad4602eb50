"""OpenTelemetry traces: one trace from a producer's call through Celery to the turn, its
steps, its harness (``TRACEPARENT``) and each tool call.

On only when the operator configures it the standard way: ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, and neither ``OTEL_SDK_DISABLED=true`` nor
``OTEL_TRACES_EXPORTER=none``. Everything else is the SDK's own environment handling: the
exporter (OTLP over HTTP/protobuf) reads its endpoint, headers, timeout and compression
from ``OTEL_EXPORTER_OTLP_*``, the batch processor ``OTEL_BSP_*``, the sampler
``OTEL_TRACES_SAMPLER``, the resource ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
(our service name is the default only). An application that installed its own tracer
provider before it made a :class:`~worker.client.HarnessClient` gets our spans in it.

Off, this module imports no OpenTelemetry at all (the SDK, its exporter and the Celery
instrumentation are never loaded): :func:`span` hands back one shared no-op context manager,
and every helper returns at its first line.

:func:`setup` is called once per process by whoever runs there first: the worker's app,
the ``harness`` command, the HTTP API, a HarnessClient. The Celery layer then instruments
Celery (``worker.app.create_app``: ``CeleryInstrumentor``), so a turn's publish and its
consume are spans of the producer's trace, the context carried in the message's headers.
:func:`shutdown`
flushes what is batched: on worker shutdown and at the end of a ``harness`` command, whose
process is too short-lived for the batch's timer.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACER_NAME = "harness-worker"
FLUSH_TIMEOUT_S = 5.0
"""How long a flush may hold a process that is going away (an unreachable collector)."""

PROVIDERS = {"claude-code": "anthropic", "codex": "openai", "gemini": "gcp.gemini"}
"""``gen_ai.provider.name`` of the harnesses bound to one vendor; opencode and pi name it as
the prefix of their ``provider/model`` model names."""

Attributes = Mapping[str, str | int | float | bool]
P = ParamSpec("P")
R = TypeVar("R")


class SpanLike(Protocol):
    """What our code does with a span: the real one's methods, or the no-op's."""

    def set_attribute(self, key: str, value: Any) -> Any: ...

    def set_attributes(self, attributes: Mapping[str, Any]) -> Any: ...

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> Any: ...

    def is_recording(self) -> bool: ...

    def set_status(self, status: Any, description: str | None = None) -> Any: ...

    def update_name(self, name: str) -> Any: ...


class _NoSpan:
    """The span of a process that does not trace: accepts everything, keeps nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def set_status(self, status: Any, description: str | None = None) -> None:
        return None

    def update_name(self, name: str) -> None:
        return None

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *_: object) -> None:
        return None


NO_SPAN = _NoSpan()


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decided = False
        self.on = False
        self.provider: TracerProvider | None = None
        """Our own provider (None when the application brought its own): flushed here."""
        self.tracer: Tracer | None = None


_state = _State()


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the operator asked for traces: an OTLP endpoint set, the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def enabled() -> bool:
    """Whether this process traces (after :func:`setup`)."""
    return _state.on


def setup(service_name: str = "harness-worker") -> bool:
    """Turn tracing on in this process if it is configured; returns whether it is on.

    Idempotent and thread-safe; only the first call decides (and names the service)."""
    if _state.decided:
        return _state.on
    with _state.lock:
        if _state.decided:
            return _state.on
        try:
            if configured():
                _state.provider = _install_provider(service_name)
                _state.on = True
            elif _application_provider():
                _state.on = True
        except Exception:  # a broken exporter setup must not stop a worker or a producer
            log.exception("tracing.setup_failed")
            _state.on = False
        _state.decided = True
        if _state.on:
            log.info("tracing.on", extra={"service": service_name})
        return _state.on


def _install_provider(service_name: str) -> TracerProvider | None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # the application installed its own: our spans go there
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def _application_provider() -> bool:
    """An application that traces already (its provider installed) gets our spans, without
    our importing OpenTelemetry into a process that has not."""
    if "opentelemetry.trace" not in sys.modules:
        return False
    from opentelemetry import trace

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def flush(timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Export what is batched now (the end of a short-lived command)."""
    if _state.provider is not None:
        _state.provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flush and stop the exporter (a worker process going away). Safe to call twice."""
    provider = _state.provider
    if provider is None:
        return
    try:
        provider.force_flush(int(FLUSH_TIMEOUT_S * 1000))
        provider.shutdown()
    except Exception:  # the process is going away: say so, do not stop it
        log.exception("tracing.shutdown_failed")
    _state.provider = None


def _tracer() -> Tracer:
    if _state.tracer is None:
        from opentelemetry import trace

        _state.tracer = trace.get_tracer(TRACER_NAME)
    return _state.tracer


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: str = "INTERNAL",
    start_time: float | None = None,
    parent: object | None = None,
) -> AbstractContextManager[SpanLike]:
    """A span of the current trace for the block it wraps (its child spans nest in it); an
    exception leaving the block is recorded on it. ``kind`` names a ``SpanKind``;
    ``start_time`` (unix seconds) starts it in the past; ``parent`` is a context
    :func:`capture` took on another thread. Off: the shared no-op."""
    if not _state.on:
        return NO_SPAN
    from opentelemetry.trace import SpanKind

    return _tracer().start_as_current_span(
        name,
        context=parent,  # type: ignore[arg-type]
        attributes=attributes,
        kind=SpanKind[kind],
        start_time=None if start_time is None else int(start_time * 1e9),
    )


def capture() -> object | None:
    """The current trace context, for spans made later on another thread (a turn's tool
    calls, answered on the MCP endpoint's loop); None when not tracing."""
    if not _state.on:
        return None
    from opentelemetry import context

    return context.get_current()


def past_span(name: str, start: float, end: float, attributes: Attributes | None = None) -> None:
    """A span that is already over (unix seconds): what a turn waited before it began."""
    if not _state.on or end < start:
        return
    started = _tracer().start_span(name, attributes=attributes, start_time=int(start * 1e9))
    started.end(end_time=int(end * 1e9))


def traced(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a producer's call: a span named ``name`` around each call while tracing."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if not _state.on:
                return fn(*args, **kwargs)
            with span(name):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def current() -> SpanLike:
    """The span the caller runs in (the no-op when not tracing)."""
    if not _state.on:
        return NO_SPAN
    from opentelemetry import trace

    return trace.get_current_span()


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), or None when not tracing."""
    if not _state.on:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None


def harness_env() -> dict[str, str]:
    """``TRACEPARENT`` (and ``TRACESTATE`` when there is one) of the current span, for a
    harness's environment: the W3C names the CLIs and OpenTelemetry's env carriers read."""
    if not _state.on:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {
        name.upper(): carrier[name] for name in ("traceparent", "tracestate") if carrier.get(name)
    }


# -- the turn's spans (GenAI semantic conventions, "invoke_agent" and "execute_tool") -------


def provider_name(harness: str, model: str | None) -> str | None:
    """``gen_ai.provider.name`` of a harness and its model, when it can be known."""
    if harness in PROVIDERS:
        return PROVIDERS[harness]
    if model and "/" in model:
        return model.split("/", 1)[0]
    return None


@contextmanager
def turn_span(harness: str, run_id: str, turn: int, model: str | None) -> Iterator[SpanLike]:
    """The turn's span, ``invoke_agent {harness}``: the parent of its steps' spans, and the
    span whose context the harness gets. Off: the no-op."""
    if not _state.on:
        yield NO_SPAN
        return
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": harness,
        "harness.run.id": run_id,
        "harness.turn": turn,
    }
    provider = provider_name(harness, model)
    if provider:
        attributes["gen_ai.provider.name"] = provider
        attributes["gen_ai.system"] = provider  # the name before semconv 1.37
    if model:
        attributes["gen_ai.request.model"] = model
    with span(f"invoke_agent {harness}", attributes, kind="CLIENT") as the_span:
        yield the_span


def record_turn(
    *,
    outcome: str,
    input_tokens: int,
    output_tokens: int,
    session_id: str | None,
    model: str | None,
) -> None:
    """What the harness reported, on the current turn span: tokens, the session (the
    conversation), the model it used, and how the turn ended."""
    if not _state.on:
        return
    current_span = current()
    attributes: dict[str, str | int] = {
        "harness.outcome": outcome,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }
    if session_id:
        attributes["gen_ai.conversation.id"] = session_id
    if model:
        attributes["gen_ai.response.model"] = model
    current_span.set_attributes(attributes)
    if outcome != "completed":
        from opentelemetry.trace import Status, StatusCode

        current_span.set_status(Status(StatusCode.ERROR, outcome))


def tool_span(
    server: str, tool: str, call_id: str, parent: object | None = None
) -> AbstractContextManager[SpanLike]:
    """A tool call's span, ``execute_tool {tool}``, for the code that handles it (``parent``:
    the turn's context, :func:`capture`, when the call is handled on another thread). Inside
    a span of the caller's own (the MCP SDK's ``tools/call``) it nests there instead."""
    if not _state.on:
        return NO_SPAN
    if parent is not None and current().is_recording():
        parent = None
    return span(
        f"execute_tool {tool}",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "extension",
            "harness.tool.server": server,
        },
        parent=parent,
    )
