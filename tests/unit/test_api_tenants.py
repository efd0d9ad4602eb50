"""Tenants of the HTTP API: the file, its keys (SHA-256 only), reload, policy, signing, rate."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import fakeredis
import pytest

from config import SettingsError, load_settings
from worker.api import tenants
from worker.api.limits import RateLimiter
from worker.api.tenants import Tenant, TenantPolicy, TenantRegistry
from worker.api.webhooks import sign
from worker.errors import InvalidInput
from worker.store.keys import Keys


@pytest.mark.parametrize("name", ["tenants.json", "tenants.toml"])
def test_a_new_key_works_and_only_its_hash_is_stored(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    tenant, key = tenants.add_tenant(
        path, "acme", policy=TenantPolicy(harnesses=("stdio-json",), max_turns=3)
    )
    text = path.read_text()
    assert key not in text and tenants.hash_key(key) in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = tenants.read_tenants(path)["acme"]
    assert again == tenant
    assert TenantRegistry(path).authenticate(key) == tenant
    assert TenantRegistry(path).authenticate(key + "x") is None


def test_a_revoked_key_stops_working_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    _, key = tenants.add_tenant(path, "acme")
    registry = TenantRegistry(path)
    assert registry.authenticate(key) is not None
    tenants.revoke(path, "acme")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))  # a coarse clock
    assert registry.authenticate(key) is None
    _, new = tenants.rotate(path, "acme")
    assert registry.authenticate(new) is not None and registry.authenticate(key) is None


def test_rotate_retires_the_old_key_unless_kept(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    _, first = tenants.add_tenant(path, "acme")
    registry = TenantRegistry(path)
    _, second = tenants.rotate(path, "acme", keep_old=True)
    assert registry.authenticate(first) and registry.authenticate(second)
    tenant, third = tenants.rotate(path, "acme")
    assert len(tenant.keys) == 1
    assert registry.authenticate(first) is None and registry.authenticate(third)
    tenants.revoke(path, "acme", tenant.keys[0].id)
    assert registry.authenticate(third) is None


def test_a_broken_file_keeps_the_last_good_tenants(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    _, key = tenants.add_tenant(path, "acme")
    registry = TenantRegistry(path)
    path.write_text("{not json")
    assert registry.authenticate(key) is not None
    with pytest.raises(SettingsError, match="HARNESS_TENANTS_FILE"):
        TenantRegistry(path)
    path.write_text(json.dumps({"tenants": {"acme": {"keys": [], "surprise": 1}}}))
    with pytest.raises(SettingsError, match="surprise"):
        tenants.read_tenants(path)


def test_names_and_duplicates_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    tenants.add_tenant(path, "acme")
    with pytest.raises(InvalidInput, match="exists"):
        tenants.add_tenant(path, "acme")
    with pytest.raises(InvalidInput, match="invalid tenant name"):
        tenants.add_tenant(path, "../x")
    with pytest.raises(InvalidInput, match="no tenant"):
        tenants.rotate(path, "nobody")


def _tenant(**policy: object) -> Tenant:
    return Tenant(name="acme", policy=TenantPolicy(**policy))  # type: ignore[arg-type]


def test_policy_narrows_never_widens() -> None:
    settings = load_settings(network="none")
    limited = _tenant(
        harnesses=("stdio-json",), networks=("none",), grants=("A",), max_cost_usd=2.0
    )
    options = tenants.apply_policy(limited, "stdio-json", {"grants": ["A"]}, settings)
    assert options["max_cost_usd"] == 2.0  # the ceiling becomes the run's budget
    for harness, asked, what in (
        ("codex", {}, "harness"),
        ("stdio-json", {"network": "bridge"}, "network"),
        ("stdio-json", {"grants": ["B"]}, "grants"),
        ("stdio-json", {"max_cost_usd": 3.0}, "ceiling"),
    ):
        with pytest.raises(InvalidInput, match=what):
            tenants.apply_policy(limited, harness, asked, settings)
    # A tenant with no policy is the operator's: nothing is filled in, nothing refused here.
    assert tenants.apply_policy(_tenant(), "codex", {"grants": ["B"]}, settings) == {
        "grants": ["B"]
    }
    with pytest.raises(InvalidInput, match="ceiling"):
        tenants.check_budget(limited, {"max_cost_usd": 0})
    tenants.check_budget(limited, {"max_cost_usd": 1.5, "max_turns": 0})


def test_a_tenants_fallback_models_fill_a_run_that_names_none() -> None:
    settings = load_settings()
    acme = _tenant(fallback_models={"codex": ("gpt-b", "gpt-c")})
    assert tenants.apply_policy(acme, "codex", {}, settings)["fallback_models"] == [
        "gpt-b",
        "gpt-c",
    ]
    named = tenants.apply_policy(acme, "codex", {"fallback_models": ["gpt-x"]}, settings)
    assert named["fallback_models"] == ["gpt-x"]  # the producer's own come first
    assert "fallback_models" not in tenants.apply_policy(acme, "pi", {}, settings)


def test_signature_matches_the_standard_webhooks_vector() -> None:
    # The example of the Standard Webhooks specification (and of svix's libraries).
    signature = sign(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_rate_limit_refuses_past_the_window_with_retry_after() -> None:
    async def scenario() -> None:
        now = [1000.0]
        redis = fakeredis.FakeAsyncRedis(decode_responses=True)
        limiter = RateLimiter(redis, Keys("t"), window_s=60, clock=lambda: now[0])
        allowed = [(await limiter.hit("acme", 3)).allowed for _ in range(4)]
        assert allowed == [True, True, True, False]
        refused = await limiter.hit("acme", 3)
        assert not refused.allowed and refused.retry_after_s == 20  # the window ends at 1020
        assert (await limiter.hit("other", 3)).allowed  # per tenant
        now[0] = 1021.0
        assert (await limiter.hit("acme", 3)).allowed
        assert (await limiter.hit("acme", 0)).allowed  # 0: no limit
        assert 0 < await redis.ttl(Keys("t").tenant_key("acme", "rate:17")) <= 61

    asyncio.run(scenario())
