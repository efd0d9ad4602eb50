"""Triggers, for a producer or the operator (``harness trigger``; the API's ``/v1/triggers``).

Each trigger belongs to one tenant (``tenant=``; none: the operator's own, made from the
command line), as a tool set does (worker/options/tenant_names.py): its name is its tenant's,
and another tenant's trigger is found by no call here. Its secret is shown once, when it is
made, and never again: every other answer masks it.
"""

from __future__ import annotations

from typing import Any

from worker.client.translate import translate
from worker.errors import InvalidInput
from worker.options.tenant_names import check_tenant
from worker.store.keys import Keys, SyncRedis
from worker.triggers.signatures import Source, check_secret, new_secret
from worker.triggers.spec import Filter, Trigger, parse_spec
from worker.triggers.store import TriggerStore


class Triggers:
    def __init__(self, redis: SyncRedis, keys: Keys, retention_s: int) -> None:
        self.store = TriggerStore(redis, keys, retention_s)

    @translate
    def add(
        self,
        name: str,
        *,
        source: Source,
        harness: str,
        input_template: str,
        secret: str | None = None,
        filter: Filter | dict[str, Any] | None = None,
        label_templates: dict[str, str] | None = None,
        repo_from_payload: bool = False,
        run: dict[str, Any] | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """A new trigger; its id, its inbound ``path`` (``POST`` there) and, when none was
        given, the secret made for it (``secret``: shown this once)."""
        if tenant is not None:
            check_tenant(tenant)
        spec = parse_spec(
            name=name,
            source=source,
            filter=filter or {},
            harness=harness,
            input_template=input_template,
            label_templates=label_templates or {},
            repo_from_payload=repo_from_payload,
            run=run or {},
        )
        made = secret is None
        secret = new_secret(spec.source) if secret is None else check_secret(spec.source, secret)
        trigger = self.store.create(spec, secret, tenant)
        return {**_shown(trigger), "secret": secret if made else None}

    @translate
    def listing(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        return [_shown(trigger) for trigger in self.store.of_tenant(tenant)]

    @translate
    def find(self, name_or_id: str, *, tenant: str | None = None) -> Trigger:
        """The tenant's trigger of that name or id; InvalidInput when it has none."""
        found = self.store.owned(name_or_id, tenant) or self.store.by_name(name_or_id, tenant)
        if found is None:
            raise InvalidInput(f"no trigger {name_or_id[:80]!r}")
        return found

    @translate
    def remove(self, name_or_id: str, *, tenant: str | None = None) -> dict[str, Any]:
        trigger = self.find(name_or_id, tenant=tenant)
        self.store.remove(trigger)
        return {"id": trigger.id, "name": trigger.name, "removed": True}

    @translate
    def deliveries(
        self, name_or_id: str, *, tenant: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """The trigger's deliveries, newest first: ``id``, ``delivery_id`` (the source's),
        ``received_at``, ``status`` (accepted, filtered, refused, duplicate, failed),
        ``reason``, ``event``, ``size`` and ``run_id``."""
        trigger = self.find(name_or_id, tenant=tenant)
        return self.store.deliveries(trigger.id, max(1, min(limit, 1000)))


def _shown(trigger: Trigger) -> dict[str, Any]:
    return {**trigger.public(), "path": f"/v1/triggers/{trigger.id}"}
