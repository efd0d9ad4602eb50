"""Which host queues a worker serves, by default and with HARNESS_HOST_QUEUE, and that their
names fit a compact run record."""

from __future__ import annotations

import re
import socket
from typing import Any, cast

import pytest
import redis

from bench.private_redis import PrivateRedis
from config import load_settings
from sandbox.base import SandboxUnavailable
from sandbox.identity import docker_name, legacy_docker_name, legacy_local_name, local_name
from worker.fleet import host_queues
from worker.options.spec import RunOptions
from worker.store.keys import Keys
from worker.store.records import RunStore

DOWN = "unix:///nonexistent/harness-docker.sock"
UUID_ID = "0f5b5c53-8d3f-4a5e-9b1c-3e2f7a9d1c4b"  # Docker 28
COLON_ID = "5LNF:BEF5:77U4:WJEE:5QSH:UHHI:KVUW:KXAA:YIEA:I6YX:JFZT:BQ6H"  # before it
MARK = "3f9a0c1d2e4b"
LONG_HOSTNAME = "ip-10-0-12-34.eu-west-1.compute.internal.example-fleet-name.com"
LISTPACK_VALUE_MAX = 64  # Redis's default hash-max-listpack-value


def _queue(prefix: str, name: str) -> str:
    return f"{prefix}.host.{name}"


def test_a_local_worker_names_its_machine() -> None:
    settings = load_settings(key_prefix="hw", sandbox="local", allowed_sandboxes=())
    served = host_queues.host_queues(settings)
    hostname = socket.gethostname()
    assert served.by_backend == {"local": f"hw.host.{local_name(hostname)}"}
    legacy = f"hw.host.local.{hostname}"
    assert served.legacy == ({} if legacy == served.by_backend["local"] else {"local": legacy})


def test_the_override_names_one_queue_for_every_backend_served() -> None:
    settings = load_settings(
        key_prefix="hw", sandbox="local", allowed_sandboxes=("docker",), host_queue="hw.host.x"
    )
    served = host_queues.host_queues(settings)
    assert served.by_backend == {"docker": "hw.host.x", "local": "hw.host.x"}
    assert served.legacy == {}
    assert served.consumed() == ["hw.host.x"]


def test_a_docker_worker_whose_daemon_does_not_answer_refuses_to_start() -> None:
    settings = load_settings(key_prefix="hw", sandbox="docker", docker_url=DOWN)
    with pytest.raises(SandboxUnavailable, match="HARNESS_HOST_QUEUE"):
        host_queues.host_queues(settings)


def test_a_daemon_merely_allowed_and_down_only_drops_its_queue() -> None:
    settings = load_settings(
        key_prefix="hw", sandbox="local", allowed_sandboxes=("docker",), docker_url=DOWN
    )
    assert list(host_queues.host_queues(settings).by_backend) == ["local"]


@pytest.mark.parametrize("daemon_id", [UUID_ID, COLON_ID])
def test_a_docker_host_queue_fits_a_listpack_value_whatever_the_id_form(daemon_id: str) -> None:
    prefix = load_settings().key_prefix
    queue = _queue(prefix, docker_name(daemon_id, MARK))
    assert len(queue.encode()) <= LISTPACK_VALUE_MAX - 16
    assert queue == f"{prefix}.host.docker.{daemon_id[:8]}.{MARK}"
    assert len(_queue(prefix, legacy_docker_name(daemon_id, MARK)).encode()) > LISTPACK_VALUE_MAX


def test_a_docker_name_keeps_the_ids_head_sanitised_and_the_whole_mark() -> None:
    assert docker_name("ab/cd ef:gh", MARK) == f"docker.ab-cd-ef.{MARK}"
    assert docker_name(UUID_ID, MARK) != docker_name(UUID_ID, "0" * 12)


def test_a_long_hostname_is_cut_and_given_a_digest() -> None:
    prefix = load_settings().key_prefix
    assert len(LONG_HOSTNAME) == 63
    name = local_name(LONG_HOSTNAME)
    assert len(_queue(prefix, name).encode()) <= LISTPACK_VALUE_MAX - 16
    assert re.fullmatch(r"local\.ip-10-0-12-34\.e-[0-9a-f]{8}", name)
    same_head = LONG_HOSTNAME[:-1] + "x"
    assert local_name(same_head) != name
    assert local_name(LONG_HOSTNAME) == name  # every worker of the machine agrees
    assert legacy_local_name(LONG_HOSTNAME) == f"local.{LONG_HOSTNAME}"


def test_a_short_hostname_is_its_name_then_and_now() -> None:
    assert local_name("build-01") == legacy_local_name("build-01") == "local.build-01"
    assert local_name("a" * 24) == f"local.{'a' * 24}"
    assert local_name("we/ird host") == "local.we-ird-host"


@pytest.fixture
def client(private_redis: PrivateRedis) -> redis.Redis:
    return redis.Redis(port=private_redis.port, decode_responses=True)


def _docker_run_record(client: redis.Redis, run_id: str, queue: str) -> str:
    """A Docker run's record as its first turn leaves it, on a Redis with Redis's defaults."""
    keys = Keys(load_settings().key_prefix)
    store = RunStore(cast(Any, client), keys, retention_s=600)
    options = RunOptions(harness="claude-code", model="claude-sonnet-4-5", network="none")
    store.create(run_id, options, queue=f"{keys.prefix}.claude-code", sandbox="docker")
    store.update(
        run_id,
        queue=queue,
        container_id="c" * 64,
        session_id="2b7e1516-28ae-4d2a-a6d2-abf7158809cf",
    )
    return keys.run(run_id)


def test_a_docker_runs_record_with_its_host_queue_stays_a_listpack(client: redis.Redis) -> None:
    prefix = load_settings().key_prefix
    now = _docker_run_record(client, "r-now", _queue(prefix, docker_name(UUID_ID, MARK)))
    assert client.object("encoding", now) == "listpack"
    # The legacy name alone is what made such a record a hash table.
    before = _docker_run_record(
        client, "r-before", _queue(prefix, legacy_docker_name(UUID_ID, MARK))
    )
    assert client.object("encoding", before) == "hashtable"
