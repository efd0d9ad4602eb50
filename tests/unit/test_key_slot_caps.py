"""A tenant's cap on a limited key's slots, enforced by the slot script (on fakeredis): the
tenant's runs never hold more than its cap, its turns past the cap keep no other tenant's turn
waiting, and the cap comes from the tenant's policy for the grants the run has."""

from __future__ import annotations

import fakeredis
import pytest

from config import load_settings
from worker.api import tenants
from worker.api.schemas import RunCreate
from worker.api.tenants import Tenant, TenantPolicy
from worker.store import lua

LIMIT = 3
BACKSTOP_S = 600.0
FORGET_S = 60.0


class Slots:
    """One limited key's slots and the script that hands them out."""

    def __init__(self) -> None:
        self.redis = fakeredis.FakeRedis(decode_responses=True)
        self.scripts = lua.scripts(self.redis)
        self.keys = tuple(f"t:slots:k:{part}" for part in ("holders", "waiting", "who", "seen"))
        self.now = 1000.0

    def take(self, member: str, producer: str, cap: int = 0) -> tuple[bool, int, int]:
        self.now += 1
        holders, waiting, who, seen = self.keys
        return self.scripts.slot_take(
            holders,
            waiting,
            who,
            seen,
            member,
            producer,
            LIMIT,
            self.now,
            BACKSTOP_S,
            FORGET_S,
            caps="t:slots:k:caps",
            cap=cap,
        )

    def release(self, member: str) -> None:
        assert self.scripts.slot_release(*self.keys, member)

    def held(self) -> set[str]:
        return set(self.redis.zrange(self.keys[0], 0, -1))


def test_a_capped_tenant_holds_no_more_than_its_cap_and_the_others_take_the_rest() -> None:
    slots = Slots()
    assert slots.take("a1", "acme", cap=1)[0]
    got, place, waiting = slots.take("a2", "acme", cap=1)
    assert not got and place == 1 and waiting == 1  # a free slot, but acme is at its cap
    assert not slots.take("a3", "acme", cap=1)[0]
    assert slots.take("b1", "beta")[0]  # asked after a2 and a3, served before them
    assert slots.take("b2", "beta")[0]
    assert slots.held() == {"a1", "b1", "b2"}
    assert not slots.take("a2", "acme", cap=1)[0]  # full now, and still at the cap
    slots.release("b1")
    assert not slots.take("a2", "acme", cap=1)[0]  # a free slot is not acme's while a1 runs
    slots.release("a1")
    assert slots.take("a2", "acme", cap=1)[0]
    assert slots.held() == {"a2", "b2"}


def test_a_turn_past_its_cap_keeps_no_other_tenants_turn_waiting() -> None:
    slots = Slots()
    assert slots.take("b0", "beta")[0]
    assert slots.take("a1", "acme", cap=1)[0]
    assert not slots.take("a2", "acme", cap=1)[0]  # waiting, past acme's cap
    # One slot free; beta's second turn ranks with acme's second (both hold one) and asked
    # later: without the cap acme's would be first and the slot would go to nobody.
    got, place, _ = slots.take("b1", "beta")
    assert got and place == 0
    assert slots.held() == {"b0", "a1", "b1"}


def test_without_a_cap_the_limit_alone_applies_and_a_cap_can_be_lifted() -> None:
    slots = Slots()
    for member in ("a1", "a2", "a3"):
        assert slots.take(member, "acme")[0]
    assert not slots.take("a4", "acme")[0]  # the operator's limit
    slots.release("a3")
    assert not slots.take("a4", "acme", cap=2)[0]  # a slot free, acme holds two already
    assert slots.redis.hget("t:slots:k:caps", "acme") == "2"
    assert slots.take("a4", "acme", cap=0)[0]  # its next run carries no cap
    assert slots.redis.hget("t:slots:k:caps", "acme") is None


def test_the_policy_gives_a_run_its_caps_for_the_grants_it_has() -> None:
    settings = load_settings(network="none")
    tenant = Tenant(name="acme", policy=TenantPolicy(key_slots={"A": 1, "C": 2}))
    options = tenants.apply_policy(tenant, "stdio-json", {"grants": ["A", "B"]}, settings)
    assert options["key_slots"] == {"A": 1}
    assert "key_slots" not in tenants.apply_policy(tenant, "stdio-json", {}, settings)
    with pytest.raises(ValueError, match="key_slots"):
        TenantPolicy(key_slots={"A": 0})
    with pytest.raises(ValueError, match="key_slots"):
        TenantPolicy(key_slots={"not a grant": 1})
    # A request cannot name its own caps: they are its tenant's.
    with pytest.raises(ValueError, match="key_slots"):
        RunCreate(harness="stdio-json", input="hi", key_slots={"A": 9})
