"""Several worker processes on two Docker hosts sharing one Redis and one broker.

The workers keep their default host queues (no HARNESS_HOST_QUEUE): each names its Docker
daemon, so the two workers of a daemon share one queue and the two daemons never do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.scale_load import Cluster, run_load, start_cluster
from tests.integration.docker_fixtures import ensure_images, require_docker

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(params=["redis", "rabbitmq"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str) -> Iterator[Cluster]:
    require_docker()
    ensure_images(["demo"])
    broker = redis_url if request.param == "redis" else request.getfixturevalue("rabbitmq_url")
    c = start_cluster(
        redis_url=redis_url, broker_url=broker, workers_per_host=2, concurrency=8, workdir=tmp_path
    )
    yield c
    c.stop()


def test_every_run_keeps_its_one_container_across_hosts(cluster: Cluster) -> None:
    queues = [cluster.host_queue(host) for host in cluster.hosts]
    assert len(set(queues)) == 2, queues
    assert all(q.startswith(f"{cluster.prefix}.host.docker.") for q in queues), queues
    client = cluster.client()
    try:
        assert set(queues) <= set(client.redis.hkeys(client.keys.hosts()))
    finally:
        client.close()
    report = run_load(cluster, runs=12, turns=3)
    assert report.violations == []
    assert report.turns == 36
    assert report.leaked == 0
    # Both hosts did work: the first turns spread over every worker of the harness queue.
    busy = [log for log in cluster.logs if "Task harness.run_turn" in log.read_text()]
    hosts = {log.name.split("-")[1][0] for log in busy}
    assert hosts == {"a", "b"}, [log.name for log in busy]
