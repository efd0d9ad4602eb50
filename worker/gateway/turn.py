"""What a turn asks of the model gateway: which grants are model keys, where they go, and the
route open while the harness runs.

:func:`plan` splits a turn's granted values: the model keys (``config.harnesses.MODEL_KEYS`` and
``HARNESS_MODEL_KEYS``) stay in the worker, and the sandbox gets a stand-in under each name.
:func:`serve` opens the turn's route (:class:`~worker.gateway.route.ModelRoute`) and points the
harness at it. A model key that cannot be routed (no upstream for the harness) is refused, never
handed over; ``HARNESS_MODEL_GATEWAY=off`` is the operator's choice to hand keys over as they
are (each run records a warning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import adapters
from adapters.events import Event, SessionError, TurnComplete
from adapters.protocol import TurnRequest
from config import Settings
from config.harnesses import model_keys
from sandbox.base import Placement, UnsafePath
from worker.errors import InvalidInput
from worker.gateway.proxy import Policy
from worker.gateway.route import ModelRoute, WireTotals
from worker.gateway.standins import StandIns
from worker.gateway.upstreams import Upstream, UpstreamError, upstream_for
from worker.observe.masking import Masker
from worker.options.spec import RunOptions
from worker.store.records import RunRecord
from worker.tools import turn as turn_tools


@dataclass(frozen=True)
class Plan:
    """A turn's model keys and where they go (``upstream`` None: no route)."""

    upstream: Upstream | None
    real: dict[str, str]
    standins: StandIns

    def sandbox_secrets(self, secrets: dict[str, str]) -> dict[str, str]:
        """What the sandbox gets: every granted value but the model keys, which are
        stand-ins."""
        return {**secrets, **self.standins.by_name}


def plan(options: RunOptions, settings: Settings, secrets: dict[str, str]) -> Plan:
    """Split the turn's granted values (InvalidInput when a model key cannot be routed)."""
    names = model_keys(settings.model_keys)
    real = {name: value for name, value in secrets.items() if name in names}
    if not real or settings.model_gateway == "off":
        return Plan(None, {}, StandIns())
    harness = options.harness
    if not adapters.get(harness).CAPABILITIES.model_gateway:
        raise InvalidInput(
            f"{harness} cannot send its model requests through the model gateway (capability "
            f"model_gateway is false): its model key {', '.join(sorted(real))} is not handed "
            "over (HARNESS_MODEL_GATEWAY)"
        )
    try:
        upstream = upstream_for(harness, options.base_url, settings.model_upstreams)
    except UpstreamError as exc:
        raise InvalidInput(f"the model upstream of {harness}: {exc}") from None
    if upstream is None:
        raise InvalidInput(
            f"{', '.join(sorted(real))} is a model key: it reaches {harness} only through the "
            "model gateway, which has no upstream for it: name one with --base-url or "
            "HARNESS_MODEL_UPSTREAMS"
        )
    return Plan(upstream, real, StandIns.issue(real))


@dataclass
class TurnRoute:
    route: ModelRoute
    request: TurnRequest


@contextlib.contextmanager
def serve(
    plan_: Plan,
    options: RunOptions,
    settings: Settings,
    request: TurnRequest,
    placement: Placement,
    workspace: Path,
    *,
    run_id: str,
    network: str,
    alive: Callable[[], bool],
    over_budget: Callable[[WireTotals], SessionError | None],
) -> Iterator[TurnRoute | None]:
    """The turn's route while the block runs (None when the turn has no model key to route).
    ``workspace`` is the run's workspace on this host."""
    if plan_.upstream is None:
        yield None
        return
    fallback = options.fallback_models or settings.fallback_models.get(options.harness, ())
    policy = Policy(
        upstream=plan_.upstream,
        standins=plan_.standins,
        request_max_bytes=settings.model_request_max_bytes,
        max_connections=settings.model_max_connections,
        fallback_models=tuple(fallback),
        fallback_on_429=settings.fallback_on_429,
        pins=settings.egress_hosts,
        ca_file=settings.model_ca_file,
    )
    route = ModelRoute(
        policy,
        run_id=run_id,
        alive=alive,
        over_budget=over_budget,
        relay_port=settings.model_relay_port,
    )
    directory: int | None = None
    try:
        if placement.backend == "docker" and network != "host":
            home = str(PurePosixPath(placement.home).relative_to(placement.workspace))
            directory, _ = turn_tools.endpoint_directory(workspace, home)
            try:
                route.open_socket(directory, f"{placement.home}/{turn_tools.DIRECTORY}")
            except UnsafePath as exc:
                raise turn_tools.EndpointRefused(
                    f"the run's model gateway is not served: {home}/{turn_tools.DIRECTORY}: {exc}"
                ) from exc
        else:
            route.open_loopback()
        yield TurnRoute(route, dataclasses.replace(request, base_url=route.base_url))
    finally:
        route.close()
        if directory is not None:
            os.close(directory)


def verdict(terminal: Event, halt: SessionError | None) -> Event:
    """A turn that failed after the model gateway stopped it (the API's rate limit or quota,
    with its retry-after; a budget spent at the gateway) fails for that, whatever the harness
    made of the answer it got (an error of its own, most often). A turn the gateway refused a
    model request for its budget ends ``budget`` even when the harness called it complete (it
    answered without the model's help). A cancel or a shutdown stays what it was."""
    if halt is None:
        return terminal
    if isinstance(terminal, TurnComplete) and halt.reason == "budget":
        return halt.model_copy(update={"exit_code": terminal.exit_code})
    if not isinstance(terminal, SessionError) or terminal.reason in ("cancelled", "shutdown"):
        return terminal
    if terminal.reason == halt.reason and (
        halt.reason == "budget" or terminal.retry_after_s is not None
    ):
        return terminal  # the harness said as much, its reset included
    return halt.model_copy(
        update={"exit_code": terminal.exit_code, "stderr_tail": terminal.stderr_tail}
    )


def record_changes(record: RunRecord, wire: WireTotals, masker: Masker) -> dict[str, Any]:
    """The run's totals as the model gateway counted them, this turn's added (the record read
    when the turn began holds the earlier turns': one turn of a run runs at a time)."""
    changes: dict[str, Any] = {
        "gateway_input_tokens": record.gateway_input_tokens + wire.input_tokens,
        "gateway_output_tokens": record.gateway_output_tokens + wire.output_tokens,
        "gateway_cached_input_tokens": record.gateway_cached_input_tokens
        + wire.cached_input_tokens,
        "gateway_requests": record.gateway_requests + wire.requests,
    }
    if wire.served_model:
        changes["model_served"] = masker.mask(wire.served_model)
    return changes
