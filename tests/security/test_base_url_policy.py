"""A producer's base URL is bounded by the operator's and the tenant's policy, whatever the
network: a harness sends its granted model key there.

Before, only network ``egress`` checked it, so ``{"harness": "claude-code", "grants":
["ANTHROPIC_API_KEY"], "base_url": "http://attacker"}`` on the default network (``bridge``)
or ``none`` sent the operator's key to that host. Now ``HARNESS_ALLOWED_BASE_URLS`` (default:
none) bounds it in ``worker/options/policy.py`` (the client's check and the worker's), a
tenant's ``base_urls`` narrows it at the API, and hosts are compared after parsing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from config import Settings, load_settings
from tests.helpers import assert_one_terminal
from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from worker.api.tenants import Tenant, TenantPolicy, apply_policy
from worker.errors import InvalidInput
from worker.options.policy import resolve
from worker.options.spec import RunOptions

pytestmark = pytest.mark.usefixtures("shipped_settings")

ATTACK: dict[str, Any] = {
    "harness": "claude-code",
    "grants": ["ANTHROPIC_API_KEY"],
    "base_url": "http://attacker",
}
NETWORKS = ("bridge", "none", "egress")
RULE = "HARNESS_ALLOWED_BASE_URLS"


def settings(**overrides: Any) -> Settings:
    return load_settings(**overrides)


def attack(network: str, base_url: str = "http://attacker") -> RunOptions:
    return RunOptions(
        harness="claude-code", grants=("ANTHROPIC_API_KEY",), base_url=base_url, network=network
    )


# -- the operator's policy (the function the client and the worker call) -----------------------


@pytest.mark.parametrize("network", NETWORKS)
def test_the_key_stealing_request_is_refused_under_every_network(network: str) -> None:
    with pytest.raises(InvalidInput, match=f"is not allowed \\(operator policy {RULE}\\)"):
        resolve(attack(network), settings())


@pytest.mark.parametrize("network", NETWORKS)
def test_by_default_no_base_url_is_allowed_even_without_a_grant(network: str) -> None:
    options = RunOptions(harness="pi", base_url="http://127.0.0.1:8080/v1", network=network)
    with pytest.raises(InvalidInput, match=RULE):
        resolve(options, settings())
    assert settings().allowed_base_urls == ()


@pytest.mark.parametrize(
    ("entry", "url"),
    [
        ("llm.internal", "https://llm.internal:8443/v1"),
        ("llm.internal", "http://LLM.Internal./v1"),
        ("llm.internal:8443", "https://llm.internal:8443/v1"),
        ("https://llm.internal:8443/v1", "https://llm.internal:8443/v1/messages"),
        ("https://llm.internal", "https://llm.internal/v1"),
        ("*.example.com", "https://eu.api.example.com/v1"),
        ("127.0.0.1", "http://127.0.0.1:9/v1"),
        ("[::1]:9", "http://[::1]:9"),
        ("*", "http://anything.test"),
    ],
)
def test_a_listed_base_url_is_allowed(entry: str, url: str) -> None:
    options = RunOptions(harness="pi", grants=("OPENAI_API_KEY",), base_url=url, network="none")
    assert resolve(options, settings(allowed_base_urls=entry)).network == "none"


@pytest.mark.parametrize(
    ("entry", "url"),
    [
        ("allowed.com", "http://allowed.com@evil.com"),  # userinfo: the host is evil.com
        ("allowed.com", "http://x:y@allowed.com"),  # no userinfo at all
        ("allowed.com", "http://allowed.com.evil.com"),  # a prefix of the text, another host
        ("allowed.com", "http://evil.com\\@allowed.com"),  # Node reads evil.com
        ("allowed.com", "http://allowed.com%2eevil.com"),  # escapes in the host
        ("allowed.com", "http://allowed.com:80%2f@evil.com"),
        ("127.0.0.1", "http://2130706433"),  # 127.0.0.1 to a WHATWG parser, not to us
        ("127.0.0.1", "http://0x7f.1"),
        ("*.example.com", "https://example.com"),  # subdomains only
        ("*.example.com", "https://example.com.evil.test"),
        ("https://allowed.com/v1", "https://allowed.com/v1/../admin"),  # dot segments
        ("https://allowed.com/v1", "https://allowed.com/v1/%2e%2e/admin"),
        ("https://allowed.com/v1", "https://allowed.com/v10"),  # whole segments
        ("https://allowed.com", "http://allowed.com"),  # the scheme
        ("https://allowed.com", "https://allowed.com:8443"),  # the scheme's port
        ("allowed.com:8443", "https://allowed.com"),
        ("127.0.0.1", "http://[::ffff:127.0.0.1]"),
    ],
)
def test_hosts_are_compared_after_parsing_never_as_text(entry: str, url: str) -> None:
    with pytest.raises(InvalidInput, match=RULE):
        resolve(attack("bridge", url), settings(allowed_base_urls=entry))


@pytest.mark.parametrize("entry", ["http://a@b", "ftp://x", "x/y", "*.", "a:99999", "%41"])
def test_an_invalid_operator_entry_refuses_every_base_url_naming_the_setting(entry: str) -> None:
    with pytest.raises(InvalidInput, match=f"{RULE} has an invalid entry"):
        resolve(attack("bridge", "https://x.test"), settings(allowed_base_urls=f"x.test,{entry}"))
    # A run without a base URL is not affected.
    assert resolve(RunOptions(harness="claude-code"), settings(allowed_base_urls=entry))


def test_egress_still_needs_the_endpoint_in_reach_after_the_base_url_is_allowed() -> None:
    allowed = settings(allowed_base_urls="https://llm.internal:8443")
    options = attack("egress", "https://llm.internal:8443/v1")
    with pytest.raises(InvalidInput, match="HARNESS_EGRESS_ALLOW_BASE_URL"):
        resolve(options, allowed)


# -- a tenant's policy narrows the operator's ----------------------------------------------------


def tenant(**policy: Any) -> Tenant:
    return Tenant(name="acme", policy=TenantPolicy(**policy))


def test_a_tenants_base_urls_narrow_the_operators() -> None:
    operator = settings(allowed_base_urls="llm.acme.test,llm.other.test")
    narrow = tenant(base_urls=("https://llm.acme.test/v1",))
    options = {"grants": ["ANTHROPIC_API_KEY"], "base_url": "https://llm.other.test/v1"}
    with pytest.raises(InvalidInput, match="tenant acme's policy base_urls"):
        apply_policy(narrow, "claude-code", options, operator)
    ok = {**options, "base_url": "https://llm.acme.test/v1/messages"}
    assert apply_policy(narrow, "claude-code", ok, operator)["base_url"] == ok["base_url"]
    # What the tenant allows, the operator must allow too (checked by resolve).
    wide = tenant(base_urls=("*",))
    stolen = {**options, "base_url": "http://attacker"}
    checked = apply_policy(wide, "claude-code", stolen, operator)
    with pytest.raises(InvalidInput, match=RULE):
        resolve(RunOptions(harness="claude-code", **checked), operator)
    # No base_urls: whatever the operator allows.
    assert apply_policy(tenant(), "claude-code", options, operator)["base_url"]


def test_a_tenant_with_an_empty_list_may_name_no_base_url() -> None:
    with pytest.raises(InvalidInput, match="base_urls"):
        apply_policy(
            tenant(base_urls=()),
            "pi",
            {"base_url": "https://x.test"},
            settings(allowed_base_urls="*"),
        )


def test_an_invalid_tenant_entry_is_refused_when_the_tenants_file_is_read() -> None:
    with pytest.raises(ValidationError, match="no user@"):
        TenantPolicy(base_urls=("http://allowed.com@evil.com",))


# -- over HTTP: a real `harness api`, and a real worker behind a permissive producer -------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("base-url"), redis_url)
    yield e
    e.close()


@pytest.fixture(scope="module")
def api(env: Env) -> Iterator[ApiProcess]:
    server = start_api(
        env,
        HARNESS_ALLOWED_BASE_URLS="https://llm.acme.test,https://llm.other.test",
        HARNESS_ALLOWED_NETWORKS="none,bridge,egress",
    )
    server.add_tenant("acme")
    server.add_tenant("narrow", policy=TenantPolicy(base_urls=("https://llm.acme.test",)))
    yield server
    server.stop()


@pytest.mark.redis
@pytest.mark.parametrize("network", NETWORKS)
def test_the_api_refuses_the_key_stealing_request_naming_the_policy(
    api: ApiProcess, network: str
) -> None:
    body = {**ATTACK, "input": "hello", "network": network}
    with api.client("acme") as http:
        before = http.get("/v1/runs").json()["runs"]
        response = http.post("/v1/runs", json=body)
        after = http.get("/v1/runs").json()["runs"]
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_input"
    assert f"operator policy {RULE}" in error["message"]
    assert after == before  # no run was made


@pytest.mark.redis
def test_the_api_applies_a_tenants_base_urls(api: ApiProcess) -> None:
    body = {**ATTACK, "input": "hello", "network": "none"}
    with api.client("narrow") as http:
        other = http.post("/v1/runs", json={**body, "base_url": "https://llm.other.test/v1"})
        own = http.post("/v1/runs", json={**body, "base_url": "https://llm.acme.test/v1"})
    assert other.status_code == 400, other.text
    assert "tenant narrow's policy base_urls" in other.json()["error"]["message"]
    assert own.status_code == 201, own.text
    with api.client("acme") as http:  # the operator allows it; acme's policy says nothing
        assert http.post("/v1/runs", json={**body, "base_url": "https://llm.other.test"}).is_success


@pytest.fixture(scope="module")
def worker(env: Env) -> Iterator[WorkerProcess]:
    process = start_worker(env)
    yield process
    process.stop()


@pytest.mark.redis
@pytest.mark.celery
def test_the_worker_refuses_it_for_a_producer_that_lets_it_through(
    env: Env, worker: WorkerProcess
) -> None:
    producer = env.client(allowed_base_urls="*")
    run_id = producer.start_run(
        "claude-code", "hello", grants=["ANTHROPIC_API_KEY"], base_url="http://attacker"
    )
    terminal = producer.wait(run_id, 1, timeout=60)
    assert assert_one_terminal([e for e in producer.events(run_id) if e.turn == 1]) == terminal
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "invalid-input"
    assert f"operator policy {RULE}" in terminal.data["error"]
    root = Path(env.vars["HARNESS_WORKSPACE_ROOT"])
    assert not (root / "local" / "run" / run_id).exists()
