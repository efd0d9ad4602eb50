"""Triggers and their deliveries in Redis (``Keys.triggers``).

``trigger:ID`` holds a trigger (JSON, its secret too: it must verify HMACs, so it is kept as
given and only ever read back by :meth:`TriggerStore.get`); ``names:TENANT`` maps each of a
tenant's trigger names to its id (``-`` for the operator's, made without a tenant: no
tenant's name is ``-``). A trigger's deliveries are ``deliveries:ID`` (their record ids,
newest first, at most :data:`DELIVERIES_KEPT`) and ``delivery:ID`` (record id to JSON); a
delivery id already seen is ``seen:ID:SHA256`` for the retention, so a replay starts nothing.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from worker.errors import InvalidInput
from worker.store.keys import Keys, SyncRedis
from worker.triggers.spec import TRIGGER_ID, Trigger, TriggerSpec, new_trigger_id

DELIVERIES_KEPT = 200
"""A trigger's deliveries kept, the newest; an older one is dropped as a new one comes."""
REASON_MAX_CHARS = 500
Status = Literal["accepted", "filtered", "refused", "duplicate", "failed"]

_RECORD = """
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('LPUSH', KEYS[1], ARGV[1])
local dropped = redis.call('LRANGE', KEYS[1], tonumber(ARGV[3]), -1)
if #dropped > 0 then
  redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
  redis.call('HDEL', KEYS[2], unpack(dropped))
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return #dropped
"""
_SETTLE = """
local found = redis.call('HGET', KEYS[1], ARGV[1])
if not found then return 0 end
local record = cjson.decode(found)
record['status'] = ARGV[2]
record['reason'] = ARGV[3]
if ARGV[4] ~= '' then record['run_id'] = ARGV[4] end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
return 1
"""


@dataclass
class TriggerStore:
    redis: SyncRedis
    keys: Keys
    retention_s: int

    def __post_init__(self) -> None:
        self._record = self.redis.register_script(_RECORD)
        self._settle = self.redis.register_script(_SETTLE)

    def _names(self, tenant: str | None) -> str:
        return self.keys.triggers(f"names:{tenant or '-'}")

    def create(self, spec: TriggerSpec, secret: str, tenant: str | None) -> Trigger:
        """The stored trigger; InvalidInput when the tenant has one of that name."""
        trigger = Trigger(
            **spec.model_dump(),
            id=new_trigger_id(),
            tenant=tenant or "",
            secret=secret,
            created_at=time.time(),
        )
        if not self.redis.execute_command("HSETNX", self._names(tenant), spec.name, trigger.id):
            raise InvalidInput(f"a trigger named {spec.name!r} exists (remove it first)")
        self.redis.set(self.keys.triggers(f"trigger:{trigger.id}"), trigger.model_dump_json())
        return trigger

    def get(self, trigger_id: str) -> Trigger | None:
        if not TRIGGER_ID.fullmatch(trigger_id):
            return None
        text = self.redis.get(self.keys.triggers(f"trigger:{trigger_id}"))
        return Trigger.model_validate_json(text) if text else None

    def owned(self, trigger_id: str, tenant: str | None) -> Trigger | None:
        """The trigger when it is ``tenant``'s (None: unknown, or another's, alike)."""
        trigger = self.get(trigger_id)
        return trigger if trigger is not None and trigger.tenant == (tenant or "") else None

    def by_name(self, name: str, tenant: str | None) -> Trigger | None:
        (found,) = self.redis.hmget(self._names(tenant), [name])
        return self.owned(found, tenant) if found else None

    def of_tenant(self, tenant: str | None) -> list[Trigger]:
        ids = self.redis.execute_command("HVALS", self._names(tenant)) or []
        found = (self.get(trigger_id) for trigger_id in sorted(ids))
        return sorted((t for t in found if t is not None), key=lambda t: t.name)

    def remove(self, trigger: Trigger) -> None:
        self.redis.execute_command("HDEL", self._names(trigger.tenant), trigger.name)
        self.redis.delete(
            self.keys.triggers(f"trigger:{trigger.id}"),
            self.keys.triggers(f"deliveries:{trigger.id}"),
            self.keys.triggers(f"delivery:{trigger.id}"),
        )

    def _seen(self, trigger_id: str, delivery: str) -> str:
        digest = hashlib.sha256(delivery.encode()).hexdigest()
        return self.keys.triggers(f"seen:{trigger_id}:{digest}")

    def first_time(self, trigger_id: str, delivery: str) -> bool:
        """Whether this is the first time the trigger sees ``delivery`` (within the
        retention): an atomic claim, so that two API processes start it once."""
        key = self._seen(trigger_id, delivery)
        return bool(self.redis.set(key, "1", ex=self.retention_s, nx=True))

    def forget(self, trigger_id: str, delivery: str) -> None:
        """Give a claim back: the delivery was refused, and may come again."""
        self.redis.delete(self._seen(trigger_id, delivery))

    def record(
        self,
        trigger_id: str,
        *,
        status: Status,
        reason: str = "",
        delivery: str = "",
        event: str = "",
        size: int = 0,
        run_id: str | None = None,
    ) -> str:
        """A delivery's record (its id, returned, is ours; ``delivery`` is the source's)."""
        record_id = "dlv" + secrets.token_hex(8)
        record = {
            "id": record_id,
            "delivery_id": _printable(delivery[:200]),
            "received_at": time.time(),
            "status": status,
            "reason": _printable(reason[:REASON_MAX_CHARS]),
            "event": _printable(event[:64]),
            "size": size,
            "run_id": run_id,
        }
        self._record(
            keys=[
                self.keys.triggers(f"deliveries:{trigger_id}"),
                self.keys.triggers(f"delivery:{trigger_id}"),
            ],
            args=[record_id, json.dumps(record), DELIVERIES_KEPT, self.retention_s],
        )
        return record_id

    def settle(
        self, trigger_id: str, record_id: str, status: Status, reason: str, run_id: str | None
    ) -> None:
        """An accepted delivery's end: its run started (``run_id``), or refused or failed."""
        self._settle(
            keys=[self.keys.triggers(f"delivery:{trigger_id}")],
            args=[record_id, status, _printable(reason[:REASON_MAX_CHARS]), run_id or ""],
        )

    def deliveries(self, trigger_id: str, limit: int = DELIVERIES_KEPT) -> list[dict[str, Any]]:
        """The trigger's deliveries, newest first."""
        ids = self.redis.lrange(self.keys.triggers(f"deliveries:{trigger_id}"), 0, limit - 1)
        if not ids:
            return []
        texts = self.redis.hmget(self.keys.triggers(f"delivery:{trigger_id}"), ids)
        return [json.loads(text) for text in texts if text]


def _printable(text: str) -> str:
    """What a sender chose (a header), as a terminal may show it."""
    return "".join(c if c.isprintable() else "?" for c in text)
