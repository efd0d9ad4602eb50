"""``HarnessClient.fork``: a new run that starts where another stood after turn K
(docs/events.md, "Forks and attempts").

The fork's workspace is the parent's snapshot after turn K (exported from the parent's host
and seeded into the fork as an archive: it may land on any host), and its conversation is
the parent's turns 1 to K: their inputs and final answers are the fork's transcript, replayed
into the fork's first turn ahead of its input (the tokens that costs are a ``usage`` of
``source: replay``). The fork is its parent's tenant's, keeps the parent's options but those
that name the parent's own places (its durable workspace, its branch, its seed, its vendor
session), and may run another harness or model. The record says ``forked_from`` and
``forked_at_turn``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.client.workspace import WorkspaceRequests
from worker.errors import InvalidInput
from worker.options.spec import check_run_id
from worker.store.keys import Keys, SyncRedis
from worker.store.records import Lineage, RunRecord, RunStore
from worker.store.status import IN_FLIGHT

NOT_INHERITED = frozenset(
    {"harness", "resume_session", "repo", "ref", "archive", "archive_bytes", "workspace",
     "push_branch"}
)  # fmt: skip
"""The parent's options a fork never takes: its own places and its seed."""
VENDOR_BOUND = frozenset({"model", "fallback_models", "base_url", "executable"})
"""Options that belong to the parent's harness: a fork to another harness drops them."""

CreateRun = Callable[..., str]
Policy = Callable[[str, dict[str, Any]], dict[str, Any]]
"""Checks a run's options for a harness, returning them as they may run (or raising)."""


class Forks:
    """Forks of runs, for :class:`worker.client.harness.HarnessClient`."""

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        store: RunStore,
        workspace: WorkspaceRequests,
        create_run: CreateRun,
        retention_s: int,
    ) -> None:
        self.client, self.keys, self.store, self.workspace = client, keys, store, workspace
        self._create, self.retention_s = create_run, retention_s

    def fork(
        self,
        run_id: str,
        input: str,
        *,
        at_turn: int | None = None,
        harness: str | None = None,
        labels: dict[str, str] | None = None,
        policy: Policy | None = None,
        **overrides: Any,
    ) -> str:
        """Fork run ``run_id`` after turn ``at_turn`` (default: its last finished turn; 0:
        its seed, no conversation) and start the fork's first turn with ``input``; the new
        run's id. ``harness`` and ``overrides`` (``model``, ``system_prompt``, ``posture``,
        the budget, ...: :meth:`HarnessClient.start_run`'s options) change what the fork
        runs; ``policy`` (the HTTP API's tenant policy) checks the options the fork would run
        with, inherited ones included. InvalidInput for a turn the run has not finished,
        RunNotFound, Refused when its host cannot export the snapshot (no snapshot of that
        turn)."""
        check_run_id(run_id)
        parent = self.store.record(run_id)
        finished = parent.turns - (1 if parent.status in IN_FLIGHT else 0)
        turn = finished if at_turn is None else at_turn
        if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn <= finished:
            raise InvalidInput(
                f"run {run_id} can be forked at turns 0 to {finished} (its finished turns), "
                f"not {at_turn!r}"
            )
        options = _inherited(parent, harness)
        options.update({k: v for k, v in overrides.items() if v is not None})
        target = harness or parent.harness
        if policy is not None:
            options = policy(target, options)
        lineage: Lineage = {"forked_from": run_id, "forked_at_turn": turn}
        conversation = [e for e in self.store.transcript(run_id) if int(e.get("turn", 0)) <= turn]
        with tempfile.TemporaryDirectory(prefix="harness-fork-") as folder:
            archive = Path(folder) / "workspace.tar.gz"
            self.workspace.export(run_id, archive, turn=turn)
            return self._create(
                target,
                input,
                archive=str(archive),
                labels={**parent.labels, **(labels or {})},
                tenant=parent.tenant,
                webhook_url=parent.webhook_url,
                lineage=lineage,
                before_send=lambda new_id: self._carry(new_id, conversation),
                **options,
            )

    def _carry(self, new_id: str, conversation: list[dict[str, Any]]) -> None:
        """The parent's turns up to the fork become the fork's transcript: its first turn
        replays them, and a later turn that cannot resume its session replays them too."""
        if not conversation:
            return
        key = self.keys.transcript(new_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.execute_command("RPUSH", key, *(json.dumps(e) for e in conversation))
        pipe.expire(key, self.retention_s)
        pipe.execute()


def _inherited(parent: RunRecord, harness: str | None) -> dict[str, Any]:
    if parent.options is None:
        return {}
    dropped = NOT_INHERITED | (VENDOR_BOUND if harness and harness != parent.harness else set())
    kept = parent.options.model_dump(exclude_defaults=True)
    options = {name: value for name, value in kept.items() if name not in dropped}
    for name, value in options.items():
        if isinstance(value, tuple):
            options[name] = list(value)
    return options
