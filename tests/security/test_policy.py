"""Point 1: a producer never gets more than the operator allows.

Each rule of the operator's policy is checked three ways: by ``policy.resolve`` (the function
both sides call), by the client before anything is written (nothing created, CLI exit 2), and
by the worker for a producer whose own settings let everything through (the worker publishes
a ``session-error`` of reason ``invalid-input`` naming the rule, and starts nothing: no
container, no workspace).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from config import Settings, load_settings
from tests.helpers import assert_one_terminal
from tests.integration.conftest import Env, WorkerProcess, make_env
from tests.security.conftest import docker_vars, start_scoped_worker
from worker.client import HarnessClient
from worker.errors import InvalidInput
from worker.options.policy import egress_allowlist, memory_bytes, resolve
from worker.options.spec import RunOptions

pytestmark = pytest.mark.usefixtures("shipped_settings")

# -- the rules, one by one (no services) -----------------------------------------------------


def settings(**overrides: Any) -> Settings:
    return load_settings(**overrides)


def demo(**fields: Any) -> RunOptions:
    fields.setdefault("executable", "harness-demo")
    return RunOptions(harness="stdio-json", **fields)


def test_default_policy_allows_only_configured_images_networks_and_executable() -> None:
    shipped = settings()
    assert shipped.allowed_images == ()
    assert set(shipped.allowed_networks) == {"none", "bridge", "egress"}
    assert shipped.allowed_executables == ("harness-demo",)
    assert shipped.allowed_sandboxes == ()


def test_image_refused_unless_configured_for_the_harness() -> None:
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_IMAGES"):
        resolve(demo(image="attacker/miner:1"), settings())
    # The image configured for another harness is not this harness's image either.
    with pytest.raises(InvalidInput, match="not allowed for stdio-json"):
        resolve(demo(image="harness-worker/clis:1"), settings())
    assert resolve(demo(image="harness-worker/demo:1"), settings()).image == "harness-worker/demo:1"


def test_image_allowed_for_one_harness_stays_refused_for_others() -> None:
    policy = settings(allowed_images="stdio-json=team/demo:2,codex=*")
    assert resolve(demo(image="team/demo:2"), policy).image == "team/demo:2"
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_IMAGES"):
        resolve(RunOptions(harness="pi", image="team/demo:2"), policy)
    assert resolve(RunOptions(harness="codex", image="any/thing:3"), policy).image == "any/thing:3"
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_IMAGES"):
        resolve(demo(image="any/thing:3"), policy)


def test_host_network_refused_until_the_operator_enables_it() -> None:
    with pytest.raises(InvalidInput, match="network 'host' is not allowed"):
        resolve(demo(network="host"), settings())
    assert resolve(demo(network="none"), settings()).network == "none"
    enabled = settings(allowed_networks="none,bridge,host")
    assert resolve(demo(network="host"), enabled).network == "host"


def test_egress_base_url_refused_unless_allowlisted_or_producer_endpoints_allowed() -> None:
    options = RunOptions(harness="pi", network="egress", base_url="https://llm.internal:8443/v1")
    # Allowed as a base URL (tests/security/test_base_url_policy.py), then reachable or not.
    allowed = "https://llm.internal:8443"
    with pytest.raises(InvalidInput, match="HARNESS_EGRESS_ALLOW_BASE_URL"):
        resolve(options, settings(allowed_base_urls=allowed))
    listed = settings(egress_allow="pi=llm.internal:8443", allowed_base_urls=allowed)
    assert resolve(options, listed).network == "egress"
    producer = settings(egress_allow_base_url=True, allowed_base_urls=allowed)
    assert resolve(options, producer).network == "egress"
    assert egress_allowlist(producer, "pi", options.base_url) == ["llm.internal:8443"]
    assert egress_allowlist(settings(), "claude-code", None) == ["api.anthropic.com:443"]
    # Without producer endpoints, a base URL adds nothing to the allowlist.
    assert egress_allowlist(settings(), "pi", options.base_url) == []


def test_network_literal_outside_the_contract_is_refused() -> None:
    with pytest.raises(ValidationError):
        demo(network="container:other")


@pytest.mark.parametrize(
    "executable",
    [
        "/bin/sh",
        "../harness-demo",
        "harness-demo ",
        "./harness-demo",
        "/usr/local/bin/harness-demo",
    ],
)
def test_executable_refused_unless_listed_exactly(executable: str) -> None:
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_EXECUTABLES"):
        resolve(demo(executable=executable), settings())


@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini", "opencode", "pi"])
def test_executable_refused_for_every_harness_but_stdio_json(harness: str) -> None:
    with pytest.raises(InvalidInput, match="only accepted for the stdio-json"):
        resolve(RunOptions(harness=harness, executable="harness-demo"), settings())


def test_sandbox_backend_bounded_by_policy() -> None:
    with pytest.raises(InvalidInput, match="HARNESS_ALLOWED_SANDBOXES"):
        resolve(demo(sandbox="local"), settings())
    assert resolve(demo(sandbox="docker"), settings()).sandbox == "docker"
    assert resolve(demo(sandbox="local"), settings(allowed_sandboxes="local")).sandbox == "local"
    assert resolve(demo(), settings(sandbox="local")).sandbox == "local"


@pytest.mark.parametrize(
    ("harness", "grant"),
    [("claude-code", "OPENAI_API_KEY"), ("codex", "ANTHROPIC_API_KEY"), ("stdio-json", "PATH")],
)
def test_grants_bounded_per_harness(harness: str, grant: str) -> None:
    options: dict[str, Any] = {"executable": "harness-demo"} if harness == "stdio-json" else {}
    with pytest.raises(InvalidInput, match=f"grant '{grant}' is not allowed for {harness}"):
        resolve(RunOptions(harness=harness, grants=(grant,), **options), settings())


def test_memory_ceiling_compares_sizes_not_strings() -> None:
    policy = settings(max_memory="1g")
    assert resolve(demo(memory="1024m"), policy).memory == "1024m"
    assert resolve(demo(memory="1073741824"), policy).memory == "1073741824"
    for too_much in ("1025m", "2g", "1073741825", "999999999999999g"):
        with pytest.raises(InvalidInput, match="HARNESS_MAX_MEMORY"):
            resolve(demo(memory=too_much), policy)


def test_memory_below_dockers_minimum_refused() -> None:
    # 0 and tiny limits would reach Docker as "no limit" or as a failure to create.
    for tiny in ("0", "0g", "5m", "1k"):
        with pytest.raises(InvalidInput, match="minimum"):
            resolve(demo(memory=tiny), settings())
    assert memory_bytes("6m") == 6 << 20
    assert resolve(demo(memory="6m"), settings()).memory == "6m"


@pytest.mark.parametrize("memory", ["1G", "-1g", "1.5g", "1t", "", "1 g", "0x10", "1g;"])
def test_memory_that_is_not_a_size_refused(memory: str) -> None:
    with pytest.raises(ValidationError, match="memory"):
        demo(memory=memory)


def test_cpus_ceiling_and_floor() -> None:
    policy = settings(max_cpus=2.0)
    assert resolve(demo(cpus=2.0), policy).cpus == 2.0
    with pytest.raises(InvalidInput, match="HARNESS_MAX_CPUS"):
        resolve(demo(cpus=2.5), policy)
    # int(1e-10 * 1e9) == 0 nano-CPUs, which Docker reads as "unlimited".
    with pytest.raises(InvalidInput, match="minimum"):
        resolve(demo(cpus=1e-10), policy)
    for odd in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValidationError):
            demo(cpus=odd)


def test_pids_ceiling() -> None:
    policy = settings(max_pids=100)
    assert resolve(demo(pids=100), policy).pids == 100
    with pytest.raises(InvalidInput, match="HARNESS_MAX_PIDS"):
        resolve(demo(pids=101), policy)
    for odd in (0, -1):  # Docker reads 0 and -1 as "unlimited"
        with pytest.raises(ValidationError):
            demo(pids=odd)


def test_timeout_ceiling() -> None:
    policy = settings(max_turn_timeout_s=100, turn_timeout_s=50)
    with pytest.raises(InvalidInput, match="HARNESS_MAX_TURN_TIMEOUT_S"):
        resolve(demo(timeout_s=float("inf")), policy)
    with pytest.raises(InvalidInput, match="HARNESS_MAX_TURN_TIMEOUT_S"):
        resolve(demo(timeout_s=100.001), policy)
    with pytest.raises(ValidationError):
        demo(timeout_s=float("nan"))


def test_limits_default_to_the_operators_and_take_the_producers_within_policy() -> None:
    policy = settings(memory="300m", cpus=1.5, pids=200, max_pids=300)
    defaults = resolve(demo(), policy)
    assert (defaults.memory, defaults.cpus, defaults.pids) == ("300m", 1.5, 200)
    asked = resolve(demo(memory="100m", cpus=0.5, pids=300), policy)
    assert (asked.memory, asked.cpus, asked.pids) == ("100m", 0.5, 300)


def test_unknown_option_refused_rather_than_ignored() -> None:
    for field in ("privileged", "cap_add", "volumes", "user", "devices", "env"):
        with pytest.raises(ValidationError, match="Extra inputs"):
            RunOptions(harness="pi", **{field: "x"})


# -- at the client: refused before anything is written --------------------------------------

# (options, input, the rule the refusal must name)
VIOLATIONS: list[tuple[dict[str, Any], str, str]] = [
    ({"image": "attacker/miner:1"}, "hi", "HARNESS_ALLOWED_IMAGES"),
    ({"network": "host"}, "hi", "HARNESS_ALLOWED_NETWORKS"),
    ({"executable": "/bin/sh"}, "hi", "HARNESS_ALLOWED_EXECUTABLES"),
    ({"grants": ["WORKER_PRIVATE"]}, "hi", "HARNESS_GRANTS"),
    ({"memory": "1g"}, "hi", "HARNESS_MAX_MEMORY"),
    ({"cpus": 3.0}, "hi", "HARNESS_MAX_CPUS"),
    ({"pids": 1000}, "hi", "HARNESS_MAX_PIDS"),
    ({"timeout_s": 1000.0}, "hi", "HARNESS_MAX_TURN_TIMEOUT_S"),
    ({"sandbox": "local"}, "hi", "HARNESS_ALLOWED_SANDBOXES"),
    ({}, "x" * 5000, "HARNESS_MAX_INPUT_BYTES"),
]
IDS = [rule for _, _, rule in VIOLATIONS]
CLI = (sys.executable, "-m", "worker.cli")
STRICT = {"HARNESS_MAX_INPUT_BYTES": "4096", **docker_vars()}


@pytest.fixture(scope="module")
def strict_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    env = make_env(tmp_path_factory.mktemp("strict"), redis_url, **STRICT)
    yield env
    for client in env.clients:
        client.close()


def _keys(env: Env) -> set[str]:
    """Run records, streams, the runs index and queued messages (not worker heartbeats)."""
    r = env.redis()
    found = set(r.scan_iter(f"{env.prefix}:run*")) | set(r.scan_iter(f"{env.prefix}.*"))
    return found | {f"{key}={r.llen(key)}" for key in found if r.type(key) == "list"}


@pytest.mark.redis
@pytest.mark.parametrize(("options", "text", "rule"), VIOLATIONS, ids=IDS)
def test_client_refuses_beyond_policy_and_creates_nothing(
    strict_env: Env, options: dict[str, Any], text: str, rule: str
) -> None:
    client = strict_env.client()
    options = {"executable": "harness-demo", **options}
    before = _keys(strict_env)
    with pytest.raises(InvalidInput, match=rule):
        client.start_run("stdio-json", text, **options)
    assert _keys(strict_env) == before  # no run record, no queued message


@pytest.mark.redis
@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        (["--memory", "4g"], "HARNESS_MAX_MEMORY"),
        (["--cpus", "64"], "HARNESS_MAX_CPUS"),
        (["--pids", "100000"], "HARNESS_MAX_PIDS"),
        (["--network", "host"], "HARNESS_ALLOWED_NETWORKS"),
        (["--image", "attacker/miner:1"], "HARNESS_ALLOWED_IMAGES"),
        (["--sandbox", "local"], "HARNESS_ALLOWED_SANDBOXES"),
        (["--grant", "HOME"], "HARNESS_GRANTS"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_cli_refuses_beyond_policy_with_exit_2_naming_the_rule(
    strict_env: Env, flags: list[str], rule: str
) -> None:
    before = _keys(strict_env)
    done = subprocess.run(
        [*CLI, "run", "stdio-json", "hi", "--executable", "harness-demo", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **strict_env.vars},
    )
    assert done.returncode == 2, done.stderr
    assert rule in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""  # no run id: nothing was accepted
    assert _keys(strict_env) == before


# -- at the worker: a producer that skips the client's check --------------------------------

PERMISSIVE = {
    "allowed_images": "*",
    "allowed_networks": "none,bridge,host",
    "allowed_executables": "*",
    "allowed_sandboxes": "*",
    "grants": "stdio-json=*",
    "max_memory": "64g",
    "max_cpus": 64.0,
    "max_pids": 100000,
    "max_turn_timeout_s": 100000.0,
    "max_input_bytes": 1 << 24,
}


@pytest.fixture(scope="module")
def strict_worker(strict_env: Env, docker_daemon: None) -> Iterator[WorkerProcess]:
    worker = start_scoped_worker(strict_env, extra_env={"WORKER_PRIVATE": "not-for-harnesses"})
    yield worker
    worker.stop()


def _run_containers(run_id: str) -> list[Any]:
    import docker

    client = docker.from_env()
    try:
        return client.api.containers(all=True, filters={"label": f"harness.run_id={run_id}"})
    finally:
        client.close()


@pytest.mark.redis
@pytest.mark.celery
@pytest.mark.docker
@pytest.mark.parametrize(("options", "text", "rule"), VIOLATIONS, ids=IDS)
def test_worker_refuses_beyond_its_policy_and_starts_nothing(
    strict_env: Env,
    strict_worker: WorkerProcess,
    options: dict[str, Any],
    text: str,
    rule: str,
) -> None:
    producer: HarnessClient = strict_env.client(**PERMISSIVE)
    options = {"executable": "harness-demo", **options}
    run_id = producer.start_run("stdio-json", text, **options)
    terminal = producer.wait(run_id, 1, timeout=60)
    assert assert_one_terminal([e for e in producer.events(run_id) if e.turn == 1]) == terminal
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "invalid-input"
    assert terminal.data["retryable"] is False
    assert rule in terminal.data["error"]
    assert producer.status(run_id)["status"] == "failed"
    assert _run_containers(run_id) == []
    root = Path(strict_env.vars["HARNESS_WORKSPACE_ROOT"])
    assert not (root / "docker" / "run" / run_id).exists()
    assert not (root / "local" / "run" / run_id).exists()
