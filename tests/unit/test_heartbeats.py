"""The owner heartbeats: one thread keeps every held owner key alive, beating once per third
of its TTL, and a new hold does not beat at once (its claim has just set the key)."""

from __future__ import annotations

import time

import fakeredis

from worker.turn.life import Heartbeats


def test_a_held_key_is_set_again_every_third_of_its_ttl_and_not_at_once_when_held() -> None:
    r = fakeredis.FakeRedis()
    beats = Heartbeats()
    r.set("owner:a", "token-a", ex=100)  # as the claim script leaves it, with a long TTL
    beats.hold(("p", "a", 1), r, "owner:a", "token-a", 3)
    time.sleep(0.3)
    assert r.ttl("owner:a") > 90  # no beat yet: the claim has just set it

    deadline = time.monotonic() + 3.0
    while r.ttl("owner:a") > 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 0 < r.ttl("owner:a") <= 3  # beaten within one interval (1 s), with the hold's TTL

    beats.drop(("p", "a", 1))
    r.delete("owner:a")
    time.sleep(1.3)
    assert r.get("owner:a") is None  # never again after a release


def test_every_held_key_keeps_living_past_its_ttl() -> None:
    r = fakeredis.FakeRedis()
    beats = Heartbeats()
    for name in ("a", "b"):
        r.set(f"owner:{name}", name, ex=1)
        beats.hold(("p", name, 1), r, f"owner:{name}", name, 1)
    time.sleep(2.5)
    assert r.get("owner:a") == b"a" and r.get("owner:b") == b"b"
    for name in ("a", "b"):
        beats.drop(("p", name, 1))


def test_a_key_a_beat_finds_gone_makes_the_hold_lost_once_and_for_good() -> None:
    r = fakeredis.FakeRedis()
    beats = Heartbeats()
    held, released = ("p", "held", 1), ("p", "released", 1)
    for slot in (held, released):
        r.set(f"owner:{slot[1]}", "t", ex=100)
        beats.hold(slot, r, f"owner:{slot[1]}", "t", 1)
    claimed = beats.confirmed_at(held)
    assert claimed is not None and not beats.lost(held)

    deadline = time.monotonic() + 3.0
    while beats.confirmed_at(held) == claimed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (beats.confirmed_at(held) or 0) > claimed  # a beat that set it confirms it

    beats.drop(released)  # a turn that ended: its key goes, and that is no lost hold
    r.delete("owner:released")
    r.delete("owner:held")  # lapsed (a Redis outage longer than its TTL)
    deadline = time.monotonic() + 3.0
    while not beats.lost(held) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert beats.lost(held) and not beats.lost(released)
    assert r.get("owner:held") is None  # never set again: the turn is not this worker's
    assert not beats.record(held, alive=True)  # lost for good, whatever a later renewal says
    beats.drop(held)
    assert not beats.lost(held) and beats.confirmed_at(held) is None


def test_a_lapsed_key_is_taken_again_when_its_renew_says_the_turn_is_still_held() -> None:
    r = fakeredis.FakeRedis()
    beats = Heartbeats()
    answers = {"kept": True, "ended": False}
    for name, answer in answers.items():
        r.set(f"owner:{name}", "t", ex=100)

        def renew(name: str = name, answer: bool = answer) -> bool:
            if answer:
                r.set(f"owner:{name}", "t", ex=1)
            return answer

        beats.hold(("p", name, 1), r, f"owner:{name}", "t", 1, renew=renew)
        r.delete(f"owner:{name}")
    deadline = time.monotonic() + 3.0
    while not beats.lost(("p", "ended", 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert beats.lost(("p", "ended", 1))
    assert not beats.lost(("p", "kept", 1)) and r.get("owner:kept") == b"t"
    for name in answers:
        beats.drop(("p", name, 1))
