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

from sandbox.docker.egress import LABEL_CONFIG
from sandbox.docker.gateway import Gateway, remove_stale
from sandbox.network import EgressConfig
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


def test_a_worker_refused_the_gateways_name_finds_the_one_being_made() -> None:
    """dockerd reserves a container's name (the other create's 409) before a lookup by that
    name finds it: the refused worker waits for it instead of failing on that lookup's 404
    (each of 30 such races here: 409, then 404 at once)."""
    require_docker()
    ensure_images(["demo"])
    client = docker.from_env()
    gateway = _gateway(EgressConfig(scope=f"egress-it-{uuid.uuid4().hex[:8]}"), client)

    def create(name: str, together: threading.Barrier, found: list[Any]) -> None:
        together.wait()
        try:
            client.api.create_container("harness-worker/demo:1", ["true"], name=name)
        except docker.errors.APIError as exc:
            found.append(gateway._made_by_another(name) if exc.status_code == 409 else exc)
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            found.append(exc)

    refused_then_found = 0
    try:
        for _ in range(5):
            name = f"harness-it-race-{uuid.uuid4().hex[:8]}"
            together, found = threading.Barrier(2), []
            threads = [threading.Thread(target=create, args=(name, together, found)) for _ in "ab"]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            made = client.containers.get(name)
            assert [getattr(f, "id", f) for f in found] in ([], [made.id])
            refused_then_found += len(found)
            made.remove(force=True)
        assert refused_then_found >= 1  # the barrier makes the creates collide
    finally:
        client.close()
