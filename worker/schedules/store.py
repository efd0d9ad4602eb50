"""Schedules in Redis: each one's spec and state (a hash), the due times of the active ones (a
sorted set shared by every worker), a tenant's names (a set) and each one's history (a
bounded list).

A schedule's name is its tenant's own (:func:`worker.options.tenant_names.owned`): two
tenants may both have a ``nightly``; one never sees, pauses or removes the other's.

A tick is fired once whatever the number of workers: :meth:`Schedules.claim` moves the
schedule's due time forward only if it is still the tick the caller read, and marks the tick
taken (``SET NX`` with a TTL), in one script.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.errors import HarnessError, Refused, RunNotFound
from worker.options.tenant_names import owned
from worker.schedules import cron
from worker.store.keys import Keys, SyncRedis

SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
"""A schedule's name: no ``.`` (a tenant's own names are ``TENANT.NAME``), and it is a valid
label value (its runs carry ``schedule=NAME``)."""
SCHEDULE_LABEL = "schedule"
"""The label naming, on a run a schedule started, the schedule."""

_CLAIM = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""
"""KEYS: the due set, the tick's mark. ARGV: the schedule, the tick read, its next tick, the
mark's TTL in ms. 1 when this caller fires the tick; 0 when another did, or the schedule was
paused, resumed or removed meanwhile."""


class ScheduleNotFound(RunNotFound):
    def __init__(self, name: str) -> None:
        HarnessError.__init__(self, f"unknown schedule {name[:80]!r}")
        self.run_id = name


class ScheduleExists(Refused):
    exit_code = 2

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} exists (remove it first)")


class Schedule(BaseModel):
    """What a schedule starts, fixed when it is added: the run's options were checked then
    against the operator's and the tenant's policy."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    tenant: str | None = None
    cron: str
    tz: str | None = None
    harness: str
    input: str
    options: dict[str, Any]
    """The run's options (``RunOptions``, as JSON)."""
    labels: dict[str, str] = {}
    webhook_url: str | None = None
    watch: bool = False
    """Whether its runs' events are delivered by webhook (a URL of the run's or its
    tenant's): each run is watched by the API's dispatcher."""
    generation: str
    """New each time the name is added: a tick's mark is never a former schedule's."""
    created_at: float

    @property
    def owned(self) -> str:
        return owned(self.tenant, self.name)


def new_generation() -> str:
    return secrets.token_hex(6)


class Schedules:
    """Every schedule operation on Redis; ``history_max`` firings kept, for ``retention_s``."""

    def __init__(
        self, client: SyncRedis, keys: Keys, *, history_max: int, retention_s: int
    ) -> None:
        self.redis = client
        self.keys = keys
        self.history_max = history_max
        self.retention_s = retention_s
        self._claim = client.register_script(_CLAIM)

    # -- the producer's side ---------------------------------------------------------------

    def add(self, schedule: Schedule, now: float | None = None) -> dict[str, Any]:
        """Store a new schedule, due at its first tick after ``now``; ScheduleExists when its
        tenant has one of that name."""
        key = self.keys.schedule(schedule.owned)
        if not self.redis.execute_command("HSETNX", key, "spec", schedule.model_dump_json()):
            raise ScheduleExists(schedule.name)
        next_at = cron.next_after(schedule.cron, schedule.tz, now or time.time())
        self.redis.hset(key, mapping={"paused": 0, "failures": 0, "next_at": next_at})
        self.redis.execute_command("ZADD", self.keys.schedules_due(), next_at, schedule.owned)
        self.redis.sadd(self.keys.schedule_names(schedule.tenant or ""), schedule.name)
        return self.show(schedule.tenant, schedule.name)

    def find(self, tenant: str | None, name: str) -> tuple[Schedule, dict[str, str]] | None:
        """The schedule and its state fields, or None."""
        if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
            return None
        return self.find_owned(owned(tenant, name))

    def find_owned(self, owned_name: str) -> tuple[Schedule, dict[str, str]] | None:
        fields = self.redis.hgetall(self.keys.schedule(owned_name))
        spec = fields.pop("spec", None)
        if not spec:
            return None
        return Schedule.model_validate_json(spec), fields

    def _get(self, tenant: str | None, name: str) -> tuple[Schedule, dict[str, str]]:
        found = self.find(tenant, name)
        if found is None:
            raise ScheduleNotFound(name)
        return found

    def show(self, tenant: str | None, name: str) -> dict[str, Any]:
        """The schedule as a producer sees it (``harness schedule list``, the API)."""
        schedule, state = self._get(tenant, name)
        return view(schedule, state)

    def names(self, tenant: str | None) -> list[str]:
        return sorted(self.redis.smembers(self.keys.schedule_names(tenant or "")))

    def listed(self, tenant: str | None) -> list[dict[str, Any]]:
        shown = []
        for name in self.names(tenant):
            found = self.find(tenant, name)
            if found is not None:
                shown.append(view(*found))
        return shown

    def pause(self, tenant: str | None, name: str, reason: str = "paused") -> dict[str, Any]:
        schedule, _ = self._get(tenant, name)
        self.set_paused(schedule.owned, reason)
        return self.show(tenant, name)

    def set_paused(self, owned_name: str, reason: str) -> None:
        self.redis.execute_command("ZREM", self.keys.schedules_due(), owned_name)
        self.redis.hset(
            self.keys.schedule(owned_name), mapping={"paused": 1, "paused_reason": reason[:500]}
        )

    def resume(self, tenant: str | None, name: str, now: float | None = None) -> dict[str, Any]:
        """Active again, due at its next tick from now, its failures forgotten."""
        schedule, _ = self._get(tenant, name)
        next_at = cron.next_after(schedule.cron, schedule.tz, now or time.time())
        self.redis.hset(
            self.keys.schedule(schedule.owned),
            mapping={
                "paused": 0,
                "paused_reason": "",
                "failures": 0,
                "judge_run_id": "",
                "next_at": next_at,
            },
        )
        self.redis.execute_command("ZADD", self.keys.schedules_due(), next_at, schedule.owned)
        return self.show(tenant, name)

    def remove(self, tenant: str | None, name: str) -> None:
        schedule, _ = self._get(tenant, name)
        self.redis.execute_command("ZREM", self.keys.schedules_due(), schedule.owned)
        self.redis.delete(
            self.keys.schedule(schedule.owned), self.keys.schedule_history(schedule.owned)
        )
        self.redis.srem(self.keys.schedule_names(tenant or ""), name)

    def history(self, tenant: str | None, name: str, limit: int = 50) -> list[dict[str, Any]]:
        """The schedule's firings, newest first."""
        schedule, _ = self._get(tenant, name)
        key = self.keys.schedule_history(schedule.owned)
        return [json.loads(line) for line in self.redis.lrange(key, 0, max(limit, 1) - 1)]

    # -- the workers' side -----------------------------------------------------------------

    def due(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Active schedules due at ``now`` (owned names), with the tick each is due for."""
        found = self.redis.execute_command(
            "ZRANGEBYSCORE", self.keys.schedules_due(), "-inf", now, "WITHSCORES",
            "LIMIT", 0, limit,
        )  # fmt: skip
        pairs = list(zip(found[::2], found[1::2], strict=True))
        return [(str(member), int(float(score))) for member, score in pairs]

    def claim(self, schedule: Schedule, tick: int, next_at: int) -> bool:
        """Whether this caller fires ``tick`` (and moved the schedule to ``next_at``)."""
        ttl_ms = min(max(next_at - tick, 60) * 2, 86_400) * 1000
        mark = self.keys.schedule_tick(schedule.owned, schedule.generation, tick)
        return bool(self._claim(keys=[self.keys.schedules_due(), mark],
                                args=[schedule.owned, tick, next_at, ttl_ms]))  # fmt: skip

    def fired(self, schedule: Schedule, entry: dict[str, Any], state: dict[str, Any]) -> None:
        """Record one firing in the history and the schedule's state."""
        key = self.keys.schedule_history(schedule.owned)
        self.redis.execute_command("LPUSH", key, json.dumps(entry, sort_keys=True))
        self.redis.execute_command("LTRIM", key, 0, self.history_max - 1)
        self.redis.expire(key, self.retention_s)
        if self.redis.exists(self.keys.schedule(schedule.owned)):  # not removed meanwhile
            self.redis.hset(self.keys.schedule(schedule.owned), mapping=state)


def view(schedule: Schedule, state: dict[str, str]) -> dict[str, Any]:
    def number(name: str) -> float | None:
        value = state.get(name)
        return float(value) if value not in (None, "") else None

    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "tz": schedule.tz or "UTC",
        "harness": schedule.harness,
        "input": schedule.input,
        "options": {k: v for k, v in schedule.options.items() if k != "harness"},
        "labels": schedule.labels,
        "paused": state.get("paused") == "1",
        "paused_reason": state.get("paused_reason") or None,
        "failures": int(state.get("failures") or 0),
        "next_at": None if state.get("paused") == "1" else number("next_at"),
        "last_fired_at": number("last_fired_at"),
        "last_run_id": state.get("last_run_id") or None,
        "last_error": state.get("last_error") or None,
        "created_at": schedule.created_at,
    }
