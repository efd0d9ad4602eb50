"""Schedules for the producer (docs/api.md, "Schedules"): runs started on a cron by the
workers (worker/schedules/). A schedule's run options are checked in full when it is added,
as ``start_run`` checks them (the API applies its tenant's policy first), and stored."""

from __future__ import annotations

import time
from typing import Any

from config import Settings
from worker.client.translate import translate
from worker.errors import InvalidInput
from worker.options.policy import check_input, check_schema, resolve
from worker.options.spec import check_labels, parse_options
from worker.options.tenant_names import check_tenant
from worker.schedules import cron
from worker.schedules.store import SCHEDULE_NAME, Schedule, Schedules, new_generation
from worker.tools import turn as turn_tools

NOT_SCHEDULED = ("archive", "attachments", "archive_bytes")
"""Run options a schedule cannot hold: files on the producer's machine, uploaded per run."""


class ScheduleRequests:
    """``add_schedule`` and the rest, for :class:`~worker.client.HarnessClient`."""

    def __init__(self, settings: Settings, schedules: Schedules) -> None:
        self.settings = settings
        self.schedules = schedules

    @translate
    def add(
        self,
        name: str,
        cron_expr: str,
        harness: str,
        input: str,
        *,
        tz: str | None = None,
        tenant: str | None = None,
        labels: dict[str, str] | None = None,
        webhook_url: str | None = None,
        watch: bool = False,
        **options: Any,
    ) -> dict[str, Any]:
        """Add schedule ``name``: at each tick of ``cron_expr`` (in ``tz``, default UTC) a run
        of ``harness`` with ``input`` and ``options`` (those of ``start_run``) starts, labelled
        ``schedule=NAME``. InvalidInput (nothing stored) when anything is refused;
        ScheduleExists when the name is taken."""
        if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
            raise InvalidInput(
                f"invalid schedule name {str(name)[:80]!r}: 1 to 63 letters, digits, '_' or "
                "'-', starting with a letter or a digit"
            )
        if tenant is not None:
            check_tenant(tenant)
        cron.check(cron_expr, tz)
        for field in NOT_SCHEDULED:
            if options.get(field):
                raise InvalidInput(f"a schedule cannot take {field}: its runs start without it")
        labels = check_labels(labels or {})
        for field in ("allow", "deny", "grants", "fallback_models", "tools", "mcp"):
            value = options.get(field)
            if value is None:
                continue
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidInput(f"invalid request: {field}: expected a list of strings")
            options[field] = tuple(value)
        run_options = parse_options(
            harness=harness, **{k: v for k, v in options.items() if v is not None}
        )
        resolve(run_options, self.settings)
        turn_tools.check(run_options, self.settings)
        check_input(input, self.settings)
        check_schema(run_options.output_schema, self.settings)
        schedule = Schedule(
            name=name,
            tenant=tenant,
            cron=cron_expr,
            tz=tz,
            harness=harness,
            input=input,
            options=run_options.model_dump(mode="json", exclude_defaults=True),
            labels=labels,
            webhook_url=webhook_url,
            watch=watch or bool(webhook_url),
            generation=new_generation(),
            created_at=time.time(),
        )
        return self.schedules.add(schedule)

    @translate
    def listed(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        return self.schedules.listed(tenant)

    @translate
    def get(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        return self.schedules.show(tenant, name)

    @translate
    def pause(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        return self.schedules.pause(tenant, name, "paused by request")

    @translate
    def resume(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        return self.schedules.resume(tenant, name)

    @translate
    def remove(self, name: str, *, tenant: str | None = None) -> None:
        self.schedules.remove(tenant, name)

    @translate
    def history(
        self, name: str, *, tenant: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        return self.schedules.history(tenant, name, limit)
