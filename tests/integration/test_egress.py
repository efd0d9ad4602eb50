"""The egress gateway's lifecycle on a real daemon: workers that start it at the same time get
one gateway, it is recreated when its own settings change, and what a killed session left is
cleared (sandbox/docker/gateway.py)."""

from __future__ import annotations

import threading
import uuid
from contextlib import nullcontext
from typing import Any

import docker
import pytest

from sandbox.docker.egress import LABEL_CONFIG, EgressConfig
from sandbox.docker.gateway import Gateway, remove_stale
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.docker]


def _gateway(config: EgressConfig, client: Any) -> Gateway:
    return Gateway(config, lambda: client, lambda *a, **k: nullcontext())


def test_workers_starting_the_gateway_at_once_share_one_and_a_settings_change_recreates_it() -> (
    None
):
    require_docker()
    ensure_images(["gateway"])
    client = docker.from_env()
    remove_stale(client, "172.30.193.0/24")
    config = EgressConfig(scope=f"egress-it-{uuid.uuid4().hex[:8]}", subnet="172.30.193.0/24")
    first, second = _gateway(config, client), _gateway(config, client)
    errors: list[BaseException] = []

    def start(gateway: Gateway) -> None:
        try:
            gateway.ensure()
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=start, args=(g,)) for g in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        found = client.containers.list(filters={"name": config.container_name})
        assert len(found) == 1 and first.health() == "healthy" == second.health()
        before = found[0].id
        first.ensure()  # nothing to do
        assert client.containers.get(config.container_name).id == before
        moved = EgressConfig(scope=config.scope, subnet=config.subnet, memory="192m")
        _gateway(moved, client).ensure()
        after = client.containers.get(config.container_name)
        assert after.id != before and after.labels[LABEL_CONFIG] == moved.fingerprint()
        # What a killed session leaves is cleared by subnet before the subnet is taken again.
        assert remove_stale(client, config.subnet) == [config.network_name]
        assert client.containers.list(all=True, filters={"name": config.container_name}) == []
    finally:
        first.remove()
        client.close()
