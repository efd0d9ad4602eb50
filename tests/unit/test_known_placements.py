"""KnownPlacements: what a Docker sandbox remembers of its runs' containers between turns."""

from __future__ import annotations

from sandbox.base import Limits, Placement, RunSpec
from sandbox.docker.placements import KnownPlacements


def spec(run_id: str = "r1", **fields: object) -> RunSpec:
    return RunSpec(run_id=run_id, image="img:1", **fields)  # type: ignore[arg-type]


def placement(run_id: str = "r1", container: str = "c1") -> Placement:
    return Placement("docker", run_id, "/workspace", "/workspace/.home", container_id=container)


def test_lookup_returns_the_remembered_placement_whatever_the_turn_labels() -> None:
    known = KnownPlacements()
    known.remember(spec(labels={"harness.lease_until": "1"}), placement())
    assert known.lookup(spec(labels={"harness.lease_until": "2"})) == placement()


def test_lookup_misses_when_the_run_asks_for_another_shape() -> None:
    known = KnownPlacements()
    known.remember(spec(), placement())
    assert known.lookup(spec(network="host")) is None
    assert known.lookup(spec(limits=Limits(memory="1g"))) is None
    assert known.lookup(spec("r2")) is None


def test_a_lookup_stays_unverified_until_taken_once() -> None:
    known = KnownPlacements()
    known.remember(spec(), placement())
    assert known.take_unverified("r1") is None  # remembered after a real check
    known.lookup(spec())
    assert known.take_unverified("r1") == spec()
    assert known.take_unverified("r1") is None


def test_forget_drops_the_run_and_its_unverified_mark() -> None:
    known = KnownPlacements()
    known.remember(spec(), placement())
    known.lookup(spec())
    known.forget("r1")
    assert known.lookup(spec()) is None
    assert known.take_unverified("r1") is None


def test_the_least_recently_used_run_goes_first_when_full() -> None:
    known = KnownPlacements(capacity=2)
    known.remember(spec("a"), placement("a"))
    known.remember(spec("b"), placement("b"))
    known.lookup(spec("a"))
    known.remember(spec("c"), placement("c"))
    assert known.lookup(spec("b")) is None
    assert known.lookup(spec("a")) == placement("a")
    assert known.lookup(spec("c")) == placement("c")
