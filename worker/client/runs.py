"""Runs created and turns sent, for :class:`worker.client.harness.HarnessClient`: the checks
before anything is made, the record, the queued turn and its message to the broker, and the
undoing of what a refused message left (:meth:`RunStarts._unsend`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from kombu.exceptions import OperationalError

from config import Settings
from worker.app_names import harness_queue
from worker.client.workspace import Loaded, WorkspaceRequests, load_attachments
from worker.errors import BudgetSpent, InvalidInput, Unavailable
from worker.observe import tracing
from worker.options.policy import attachment_limits, check_input, check_schema, resolve
from worker.options.spec import TurnPayload, check_labels, new_run_id, parse_options
from worker.options.tenant_names import check_tenant
from worker.spend import budgets
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis
from worker.store.listing import unindex_run
from worker.store.queued import QueuedTurn, SendTurn
from worker.store.records import Lineage, RunStore
from worker.store.status import IN_FLIGHT
from worker.tools import turn as turn_tools


class RunStarts:
    def __init__(
        self,
        settings: Settings,
        redis_client: SyncRedis,
        keys: Keys,
        store: RunStore,
        workspace: WorkspaceRequests,
        sender: Callable[[], SendTurn],
    ) -> None:
        self.settings, self.redis, self.keys, self.store = settings, redis_client, keys, store
        self.workspace, self._sender = workspace, sender

    def create(
        self,
        harness: str,
        input: str,
        *,
        lineage: Lineage | None = None,
        before_send: Callable[[str], None] | None = None,
        **options: Any,
    ) -> str:
        """A new run and its first turn sent (``HarnessClient.start_run``'s options)."""
        labels = check_labels(options.pop("labels", None) or {})
        tenant = options.pop("tenant", None)
        if tenant is not None:
            check_tenant(tenant)  # it owns the names the run chose (tenant_names.owned)
        webhook_url = options.pop("webhook_url", None)
        archive = options.pop("archive", None)
        attached = self._load(options.pop("attachments", None))
        if archive is not None:
            options["archive"] = "0" * 64  # validated with the options; replaced below
        for name in ("allow", "deny", "grants", "fallback_models"):
            value = options.get(name)
            if value is None:
                continue
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidInput(f"invalid request: {name}: expected a list of strings")
            options[name] = tuple(value)
        run_options = parse_options(
            harness=harness, **{k: v for k, v in options.items() if v is not None}
        )
        resolved = resolve(run_options, self.settings)
        turn_tools.check(run_options, self.settings)  # tools=[...], mcp=[...]: docs/mcp.md
        check_input(input, self.settings)
        check_schema(run_options.output_schema, self.settings)
        run_id = new_run_id()
        if archive is not None:
            digest, size = self.workspace.upload_archive(run_id, Path(archive))
            run_options = run_options.model_copy(update={"archive": digest, "archive_bytes": size})
        queue = harness_queue(harness, self.settings.key_prefix)
        budget = budgets.initial(run_options, self.settings)
        self.store.create(
            run_id,
            run_options,
            queue=queue,
            sandbox=resolved.sandbox,
            budget=budget,
            labels=labels,
            tenant=tenant,
            webhook_url=webhook_url,
            warnings=list(resolved.warnings),
            lineage=lineage,
        )
        if before_send is not None:
            before_send(run_id)
        self._send(run_id, 1, input, queue, attached)
        return run_id

    def submit(
        self,
        run_id: str,
        input: str,
        attachments: list[str | Path] | None,
        output_schema: dict[str, Any] | None,
    ) -> int:
        """The run's next turn begun and sent (``HarnessClient.submit_turn``)."""
        check_input(input, self.settings)
        check_schema(output_schema, self.settings)
        attached = self._load(attachments)
        record = self.store.find(run_id)
        over = None if record is None else budgets.submit_refusal(record, self.settings)
        if over is not None and record is not None and record.status == "idle":
            raise BudgetSpent(
                f"run {run_id}: {over.error('for its next turn').error}".replace("RUN_ID", run_id)
            )
        turn = self.store.begin_turn(run_id)
        assert record is not None  # begin_turn raised RunNotFound otherwise
        # Only a turn in flight moves the run's queue (to its host's): the record read above
        # names the queue unless a turn was in flight then (and has ended since).
        if record.status in IN_FLIGHT:
            record = self.store.record(run_id)
        queue = record.queue or harness_queue(record.harness, self.settings.key_prefix)
        self._send(run_id, turn, input, queue, attached, output_schema)
        return turn

    def _load(self, attachments: object) -> list[Loaded]:
        if attachments is None:
            return []
        if not isinstance(attachments, list | tuple):
            raise InvalidInput("invalid request: attachments: expected a list of file paths")
        return load_attachments(attachments, attachment_limits(self.settings))

    def _send(
        self,
        run_id: str,
        turn: int,
        input: str,
        queue: str,
        attached: list[Loaded] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> None:
        refs = self.workspace.upload_attachments(run_id, turn, attached) if attached else ()
        payload = TurnPayload(
            run_id=run_id, turn=turn, input=input, attachments=refs, output_schema=output_schema
        ).model_dump()
        tracing.current().set_attributes({"harness.run.id": run_id, "harness.turn": turn})
        entry = QueuedTurn.first(payload, queue, time.time())
        entry.write(self.redis, self.keys, run_id, turn, self.settings.retention_s)
        try:
            self._sender()(payload, queue, 0.0)
        except Exception as exc:
            # Nothing will run this turn: leave nothing that says otherwise (the reaper would
            # re-send a queued payload, and a run record without a turn would never expire).
            undone = self._unsend(run_id, turn, exc)
            if isinstance(exc, (OperationalError, *REDIS_ERRORS)):
                raise Unavailable(f"cannot reach the broker: {exc}; {undone}") from exc
            raise

    def _unsend(self, run_id: str, turn: int, exc: Exception) -> str:
        """Undo a turn whose message the broker refused; says what is left."""
        try:
            if turn == 1:
                record = self.store.find(run_id)
                pipe = self.redis.pipeline()
                if record is not None:
                    unindex_run(
                        pipe, self.keys, run_id, record.tenant, record.harness, record.labels
                    )
                pipe.delete(
                    self.keys.turn_queued(run_id, turn),
                    self.keys.upload(run_id),
                    *self.keys.run_keys(run_id),
                )
                pipe.srem(self.keys.runs_index(), run_id)
                pipe.execute()
                return "the run was not created"
            if not self.store.unbegin_turn(run_id, turn):
                return f"turn {turn} was not sent, yet run {run_id} moved on meanwhile"
            self.store.update(run_id, last_error=f"turn {turn} could not be sent: {exc}")
            return (
                f"turn {turn} was not sent and run {run_id} is idle again "
                f"(its next turn is turn {turn})"
            )
        except redis.RedisError:
            if turn == 1:
                return f"run {run_id} may be left in Redis (unreachable too)"
            return f"run {run_id} may still look busy (Redis is unreachable too)"
