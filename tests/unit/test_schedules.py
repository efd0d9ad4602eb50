"""Schedules on fakeredis (worker/schedules/): adding checks everything, a tenant's names are
its own, each tick fires once whatever the number of firers, a missed window fires once,
failures in a row pause a schedule, and time zones are DST-correct."""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

from config import Settings, load_settings
from sandbox.base import Sandbox
from worker.client.schedules import ScheduleRequests
from worker.deps import Shutdown, TurnDeps
from worker.errors import InvalidInput
from worker.options.spec import TurnPayload
from worker.schedules import cron, firing
from worker.schedules.store import ScheduleExists, ScheduleNotFound, Schedules
from worker.store.keys import Keys
from worker.store.queued import read as read_queued
from worker.store.records import RunStore

PREFIX = "tsched"
EVERY_MINUTE = "* * * * *"


def _settings(**overrides: Any) -> Settings:
    for name in list(os.environ):
        if name.startswith("HARNESS_"):
            os.environ.pop(name)
    overrides.setdefault("allowed_executables", ("*",))
    return load_settings(sandbox="local", key_prefix=PREFIX, **overrides)


class Fleet:
    """Workers (each a client of one fake Redis server) and a producer's requests."""

    def __init__(self, **settings: Any) -> None:
        self.server = fakeredis.FakeServer()
        settings.setdefault("schedule_history", 5)
        self.settings = _settings(**settings)
        self.keys = Keys(PREFIX)
        self.sent: list[tuple[dict[str, Any], str]] = []
        self.redis = self.client()
        self.requests = ScheduleRequests(self.settings, self.schedules(self.redis))

    def client(self) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=self.server, decode_responses=True)

    def schedules(self, client: fakeredis.FakeRedis) -> Schedules:
        return Schedules(client, self.keys, history_max=5, retention_s=3600)

    def worker(self, settings: Settings | None = None) -> TurnDeps:
        client = self.client()
        settings = settings or self.settings

        def no_sandbox(backend: str) -> Sandbox:
            raise AssertionError("a firing needs no sandbox")

        return TurnDeps(
            settings=settings,
            redis=client,
            keys=self.keys,
            store=RunStore(client, self.keys, settings.retention_s),
            sandbox_for=no_sandbox,
            worker_id="w",
            shutdown=Shutdown(1.0),
            send_turn=lambda payload, queue, countdown: self.sent.append((payload, queue)),
        )

    def add(self, name: str = "nightly", cron_expr: str = EVERY_MINUTE, **options: Any) -> int:
        """Add a schedule; its first tick."""
        options.setdefault("executable", "/bin/true")
        added = self.requests.add(name, cron_expr, "stdio-json", "do the nightly thing", **options)
        return int(added["next_at"])

    def history(self, name: str = "nightly", tenant: str | None = None) -> list[dict[str, Any]]:
        return self.requests.history(name, tenant=tenant)

    def runs(self) -> list[str]:
        return sorted(self.redis.smembers(self.keys.runs_index()))


def test_a_due_schedule_starts_a_labelled_run_and_moves_to_its_next_tick() -> None:
    fleet = Fleet()
    first = fleet.add(labels={"team": "blue"}, model="m1")
    assert first % 60 == 0
    deps = fleet.worker()
    assert firing.fire_due(deps, now=first - 1) == []  # not due yet
    (line,) = firing.fire_due(deps, now=first + 1)
    (run_id,) = fleet.runs()
    assert run_id in line
    record = deps.store.record(run_id)
    assert record.labels == {"team": "blue", "schedule": "nightly"}
    assert record.options is not None and record.options.model == "m1"
    assert record.status == "starting" and record.queue == f"{PREFIX}.stdio-json"
    ((payload, queue),) = fleet.sent
    assert TurnPayload.model_validate(payload).input == "do the nightly thing"
    assert queue == f"{PREFIX}.stdio-json"
    assert read_queued(fleet.redis, fleet.keys, run_id, 1) is not None  # the reaper's copy
    shown = fleet.requests.get("nightly")
    assert shown["next_at"] == first + 60 and shown["last_run_id"] == run_id
    (entry,) = fleet.history()
    assert entry == {"tick": first, "fired_at": first + 1, "run_id": run_id}
    assert firing.fire_due(deps, now=first + 10) == []  # that tick is done


def test_two_firers_at_once_fire_each_tick_exactly_once() -> None:
    fleet = Fleet()
    first = fleet.add(cron_expr="*/5 * * * * *")  # every five seconds
    workers = [fleet.worker(), fleet.worker()]
    fired: list[list[str]] = [[], []]
    for tick in range(12):
        now = first + 5 * tick + 0.5
        barrier = threading.Barrier(2)

        def fire(i: int, now: float = now, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            fired[i] += firing.fire_due(workers[i], now=now)

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(fired[0]) + len(fired[1]) == 12
    assert len(fleet.runs()) == 12 and len(fleet.sent) == 12
    ticks = [entry["tick"] for entry in fleet.schedules(fleet.redis).history(None, "nightly", 50)]
    assert ticks == [first + 5 * n for n in range(11, 6, -1)]  # bounded: the newest five


def test_the_claim_refuses_a_tick_already_taken_or_moved() -> None:
    fleet = Fleet()
    first = fleet.add()
    store = fleet.schedules(fleet.redis)
    found = store.find(None, "nightly")
    assert found is not None
    schedule = found[0]
    assert store.claim(schedule, first, first + 60)
    assert not store.claim(schedule, first, first + 60)  # a second firer
    assert not store.claim(schedule, first, first + 120)  # a stale reading
    store.pause(None, "nightly")
    assert not store.claim(schedule, first + 60, first + 120)  # paused meanwhile


def test_a_window_missed_while_no_worker_ran_fires_once_and_counts_from_now() -> None:
    fleet = Fleet()
    first = fleet.add()
    deps = fleet.worker()
    back = first + 3600 + 15  # an hour late: sixty ticks were missed
    assert len(firing.fire_due(deps, now=back)) == 1
    assert firing.fire_due(deps, now=back + 1) == []
    assert len(fleet.runs()) == 1
    (entry,) = fleet.history()
    assert entry["missed"] is True and entry["tick"] == first
    assert fleet.requests.get("nightly")["next_at"] == first + 3660


def test_creation_failures_in_a_row_pause_the_schedule_saying_why() -> None:
    fleet = Fleet()
    first = fleet.add()
    # The operator's policy changed since: the executable is no longer allowed.
    deps = fleet.worker(_settings(allowed_executables=("/opt/other",)))
    for minute in range(5):
        firing.fire_due(deps, now=first + 60 * minute + 1)
    shown = fleet.requests.get("nightly")
    assert shown["paused"] and shown["failures"] == 3 and shown["next_at"] is None
    assert "3 firings in a row failed" in shown["paused_reason"]
    assert "executable" in shown["paused_reason"]
    assert len(fleet.history()) == 3 and not fleet.runs()
    assert all("error" in entry for entry in fleet.history())
    resumed = fleet.requests.resume("nightly")
    assert not resumed["paused"] and resumed["failures"] == 0 and resumed["paused_reason"] is None
    assert resumed["next_at"] is not None


def test_runs_whose_first_turn_failed_count_as_failures_and_a_good_one_resets() -> None:
    fleet = Fleet(schedule_max_failures=2)
    first = fleet.add()
    deps = fleet.worker()

    def fire(minute: int) -> None:
        firing.fire_due(deps, now=first + 60 * minute + 1)

    def fail_last_run() -> None:
        run_id = fleet.requests.get("nightly")["last_run_id"]
        data = json.dumps({"reason": "harness", "error": "boom"})
        fleet.redis.xadd(
            fleet.keys.events(run_id), {"type": "session-error", "data": data}, id="1-0"
        )

    fire(0)
    fail_last_run()
    fire(1)  # judges run 1: one failure
    assert fleet.requests.get("nightly")["failures"] == 1
    fire(2)  # run 2 did not fail: forgotten
    assert fleet.requests.get("nightly")["failures"] == 0
    fail_last_run()
    fire(3)
    fail_last_run()
    fire(4)  # the second failed run in a row: paused before starting another
    shown = fleet.requests.get("nightly")
    assert shown["paused"] and "first turn failed: harness: boom" in shown["paused_reason"]
    assert len(fleet.runs()) == 4
    assert firing.fire_due(deps, now=first + 60 * 9) == []


def test_adding_checks_the_name_the_cron_the_zone_and_the_run() -> None:
    fleet = Fleet()
    for bad in (
        lambda: fleet.requests.add("a.b", EVERY_MINUTE, "stdio-json", "x", executable="/x"),
        lambda: fleet.requests.add("n", "61 * * * *", "stdio-json", "x", executable="/x"),
        lambda: fleet.requests.add("n", "* * *", "stdio-json", "x", executable="/x"),
        lambda: fleet.requests.add(
            "n", EVERY_MINUTE, "stdio-json", "x", executable="/x", tz="Mars/Base"
        ),
        lambda: fleet.requests.add("n", EVERY_MINUTE, "no-such-harness", "x"),
        lambda: fleet.requests.add("n", EVERY_MINUTE, "stdio-json", "", executable="/x"),
        lambda: fleet.requests.add(
            "n", EVERY_MINUTE, "stdio-json", "x", executable="/x", archive="/tmp/a.tar"
        ),
    ):
        with pytest.raises(InvalidInput):
            bad()
    assert fleet.requests.listed() == []
    fleet.requests.add("n", EVERY_MINUTE, "stdio-json", "x", executable="/x")
    with pytest.raises(ScheduleExists):
        fleet.requests.add("n", EVERY_MINUTE, "stdio-json", "x", executable="/x")


def test_a_tenants_schedules_are_its_own() -> None:
    fleet = Fleet()
    for tenant in ("acme", "umbrella"):
        fleet.requests.add(
            "nightly", EVERY_MINUTE, "stdio-json", tenant, executable="/x", tenant=tenant
        )
    assert [s["input"] for s in fleet.requests.listed(tenant="acme")] == ["acme"]
    assert fleet.requests.listed() == []  # none made without a tenant
    fleet.requests.pause("nightly", tenant="acme")
    assert not fleet.requests.get("nightly", tenant="umbrella")["paused"]
    fleet.requests.remove("nightly", tenant="umbrella")
    for call in (fleet.requests.get, fleet.requests.pause, fleet.requests.history):
        with pytest.raises(ScheduleNotFound):
            call("nightly", tenant="umbrella")
    assert fleet.requests.get("nightly", tenant="acme")["paused"]
    firing.fire_due(fleet.worker(), now=4_000_000_000)  # paused, removed: nothing fires
    assert fleet.runs() == []


def test_a_time_zone_keeps_wall_clock_time_across_dst() -> None:
    def at(text: str) -> float:
        return datetime.fromisoformat(text).timestamp()

    def utc(ts: int) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")

    # 09:00 in Berlin is 08:00 UTC in winter, 07:00 UTC in summer (from 30 March 2025).
    first = cron.next_after("0 9 * * *", "Europe/Berlin", at("2025-03-29T09:30:00+00:00"))
    second = cron.next_after("0 9 * * *", "Europe/Berlin", first)
    assert (utc(first), utc(second)) == ("2025-03-30 07:00", "2025-03-31 07:00")
    assert utc(cron.next_after("0 9 * * *", None, first)) == "2025-03-30 09:00"  # UTC
    # 02:30 happens twice on 26 October 2025 in Berlin: it fires once that day.
    ticks = [cron.next_after("30 2 * * *", "Europe/Berlin", at("2025-10-25T12:00:00+00:00"))]
    for _ in range(2):
        ticks.append(cron.next_after("30 2 * * *", "Europe/Berlin", ticks[-1]))
    assert [utc(t) for t in ticks] == ["2025-10-26 00:30", "2025-10-27 01:30", "2025-10-28 01:30"]


def test_six_fields_take_seconds_first() -> None:
    assert cron.next_after("*/5 * * * * *", None, 1_800_000_001) == 1_800_000_005
    cron.check("*/5 * * * * *", None)
