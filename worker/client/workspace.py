"""The producer's side of work in and out: the archive upload of a new run, and diff, export
and rewind requests answered by the run's host (:mod:`worker.workspace.ops`)."""

from __future__ import annotations

import hashlib
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from config import Settings
from worker.app_names import TASK_WORKSPACE
from worker.errors import InvalidInput, Refused
from worker.fleet import hosts
from worker.options import attachments as checks
from worker.options.attachments import AttachmentLimits
from worker.options.spec import AttachmentRef
from worker.store.keys import Keys, SyncRedis
from worker.store.transfer import BinaryRedis, binary_client, push_bytes, read_reply, upload


@dataclass(frozen=True)
class Loaded:
    """One attachment read and checked by the client, waiting to be uploaded."""

    ref: AttachmentRef
    data: bytes


def load_attachments(paths: Sequence[str | Path], limits: AttachmentLimits) -> list[Loaded]:
    """Read and check a turn's files (count, sizes, names, images by their bytes), before
    anything is created; InvalidInput names the first file that breaks a bound."""
    if isinstance(paths, str | Path):
        raise InvalidInput("invalid request: attachments: expected a list of file paths")
    checks.check_count(len(paths), limits)
    loaded, total = [], 0
    for given in paths:
        path = Path(given)
        try:
            facts = path.stat()
            if not stat.S_ISREG(facts.st_mode):
                raise InvalidInput(f"cannot read the attachment {str(path)!r}: not a file")
            size = facts.st_size
            checks.check_size(path.name, size, total + size, limits)
            with path.open("rb") as source:
                data = source.read(limits.max_bytes + 1)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise InvalidInput(f"cannot read the attachment {str(path)!r}: {reason}") from None
        total += len(data)
        checks.check_size(path.name, len(data), total, limits)
        name = checks.safe_name(path.name)
        ref = AttachmentRef(
            name=name,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            media_type=checks.media_type(path.name, data),  # type: ignore[arg-type]
        )
        loaded.append(Loaded(ref, data))
    checks.check_names([item.ref.name for item in loaded])
    return loaded


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

    def upload_attachments(
        self, run_id: str, turn: int, loaded: list[Loaded]
    ) -> tuple[AttachmentRef, ...]:
        """Push a turn's checked attachments; the references its message carries."""
        for index, item in enumerate(loaded):
            key = self.keys.attachment(run_id, turn, index)
            push_bytes(self.binary, key, item.data, self.settings.retention_s)
        return tuple(item.ref for item in loaded)

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
