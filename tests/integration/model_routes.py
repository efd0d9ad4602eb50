"""A turn's model route for the gateway's tests: a stand-in issued for the operator's key,
the route to an upstream opened on loopback as a worker opens it."""

from __future__ import annotations

from typing import Any

from worker.gateway.proxy import Policy
from worker.gateway.route import ModelRoute
from worker.gateway.standins import StandIns
from worker.gateway.upstreams import Upstream

REAL = "sk-real-key-of-the-operator-0123456789"
"""The operator's key: the upstream must see it, the harness never."""


def route_to(base_url: str, *, client: Any = None, **policy: Any) -> tuple[ModelRoute, str]:
    """(the route, the stand-in the harness holds) to the upstream at ``base_url``, open;
    ``client``: an upstream client of the test's own instead of the loop's cached one."""
    standins = StandIns.issue({"OPENAI_API_KEY": REAL})
    route = ModelRoute(
        Policy(
            upstream=Upstream.parse(base_url, "base-url"),
            standins=standins,
            request_max_bytes=1 << 20,
            **policy,
        ),
        run_id="r-test",
        alive=lambda: True,
        over_budget=lambda wire: None,
        relay_port=0,
    )
    if client is not None:
        route.client = client
    route.open_loopback()
    return route, standins.by_name["OPENAI_API_KEY"]
