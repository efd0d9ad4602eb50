"""The producer's side of work in and out: the archive upload of a new run, and diff, export
and rewind requests answered by the run's host (:mod:`worker.workspace.ops`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from config import Settings
from worker.app_names import TASK_WORKSPACE
from worker.errors import Refused
from worker.fleet import hosts
from worker.store.keys import Keys, SyncRedis
from worker.store.transfer import BinaryRedis, binary_client, read_reply, upload


class WorkspaceRequests:
    """Uploads and workspace requests of one client (its settings, Redis and Celery app)."""

    def __init__(self, settings: Settings, keys: Keys, redis: SyncRedis, app: Callable[[], Celery]):
        self.settings, self.keys, self.redis, self._app = settings, keys, redis, app
        self._binary: BinaryRedis | None = None

    @property
    def binary(self) -> BinaryRedis:
        if self._binary is None:
            self._binary = binary_client(self.settings.redis_url)
        return self._binary

    def close(self) -> None:
        if self._binary is not None:
            self._binary.close()

    def upload_archive(self, run_id: str, path: Path) -> tuple[str, int]:
        """Upload the archive for run ``run_id``'s seed; its SHA-256 and size."""
        return upload(
            self.binary,
            self.keys.upload(run_id),
            path,
            self.settings.archive_max_bytes,
            self.settings.retention_s,
        )

    def discard_upload(self, run_id: str) -> None:
        self.binary.delete(self.keys.upload(run_id))

    def ask(
        self,
        run_id: str,
        queue: str | None,
        op: str,
        on_data: Callable[[bytes], object],
        *,
        turn: int | None = None,
        from_turn: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send ``op`` to the run's host and read its reply; the reply's facts.

        Refused when the run has no host yet (no turn ever ran), or the host says no;
        Unavailable when no live worker there answers in time.
        """
        if not queue or not hosts.is_host_queue(queue, self.keys):
            raise Refused(f"run {run_id} has no workspace yet: no turn of it has started")
        request_id = secrets.token_hex(8)
        wait = timeout or self.settings.workspace_reply_timeout_s
        request = {
            "run_id": run_id,
            "request_id": request_id,
            "op": op,
            "turn": turn,
            "from_turn": from_turn,
        }
        # A request that no worker takes in time is dropped by the broker, not run late.
        self._app().send_task(TASK_WORKSPACE, args=[request], queue=queue, expires=wait)
        return read_reply(
            self.binary,
            self.keys.reply(run_id, request_id),
            on_data,
            timeout_s=wait,
            alive=lambda: hosts.alive(self.redis, self.keys, queue),
        )
