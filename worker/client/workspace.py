"""The producer's side of work in and out: the archive upload of a new run, and diff, export
and rewind requests answered by the run's host (:mod:`worker.workspace.ops`)."""

from __future__ import annotations

import errno
import hashlib
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from celery import Celery

from config import Settings
from worker.app_names import TASK_WORKSPACE
from worker.client.translate import translate
from worker.errors import InvalidInput, Refused, RunBusy, RunEnded
from worker.fleet import hosts
from worker.options import attachments as checks
from worker.options.attachments import AttachmentLimits
from worker.options.spec import AttachmentRef, check_run_id
from worker.store.keys import Keys, SyncRedis
from worker.store.records import RunStore
from worker.store.status import FINISHED, IN_FLIGHT
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

    def __init__(
        self,
        settings: Settings,
        keys: Keys,
        redis: SyncRedis,
        store: RunStore,
        app: Callable[[], Celery],
    ):
        self.settings, self.keys, self.redis, self.store = settings, keys, redis, store
        self._app = app
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

    @translate
    def diff(
        self,
        run_id: str,
        *,
        turn: int | None = None,
        from_turn: int | None = None,
        to_turn: int | None = None,
        out: BinaryIO | None = None,
    ) -> bytes:
        """A unified diff of the run's workspace, from the run's host: what turn ``turn``
        changed, or from snapshot ``from_turn`` (default: the first) to ``to_turn`` (default:
        the last). Binary files are named, not dumped. Written to ``out`` when given (then
        returns b""), else returned. Refused when there is no such snapshot; InvalidInput,
        before the host is asked, for a turn below 0."""
        check_run_id(run_id)
        _check_snapshot(turn, "turn")
        _check_snapshot(from_turn, "from")
        _check_snapshot(to_turn, "to")
        if turn is not None and (from_turn is not None or to_turn is not None):
            raise InvalidInput("give either a turn, or from and to turns, not both")
        if turn is not None:
            from_turn, to_turn = max(turn - 1, 0), turn
        if from_turn is None and to_turn is not None:
            from_turn = 0
        parts: list[bytes] = []

        def sink(data: bytes) -> None:
            if out is not None:
                out.write(data)
            else:
                parts.append(data)

        self.ask(run_id, self._queue(run_id), "diff", sink, turn=to_turn, from_turn=from_turn)
        return b"".join(parts)

    @translate
    def export(self, run_id: str, path: str | Path, *, turn: int | None = None) -> dict[str, Any]:
        """Write a tar.gz of the workspace as it was after ``turn`` (default: the last) to
        ``path``; the reply's facts (``turn``, ``bytes``). Refused above the operator's
        HARNESS_EXPORT_MAX_BYTES; nothing is left at ``path`` then. InvalidInput, before the
        host is asked, when ``path`` cannot be written (its folder is missing, it is a
        folder, no permission), or later when writing it fails; nothing is left then
        either; InvalidInput too for a turn below 0."""
        check_run_id(run_id)
        _check_snapshot(turn, "turn")
        target = Path(path)
        partial = target.with_name(f".{target.name}.partial")
        try:
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "it is a folder")
            out = partial.open("wb")
        except OSError as exc:
            raise _unwritable(target, exc) from None
        try:
            with out:
                facts = self.ask(
                    run_id, self._queue(run_id), "export", _writer(out, target), turn=turn
                )
            try:
                partial.replace(target)
            except OSError as exc:
                raise _unwritable(target, exc) from None
        finally:
            partial.unlink(missing_ok=True)
        return facts

    @translate
    def rewind(self, run_id: str, turn: int) -> dict[str, Any]:
        """Put the workspace back as it was after ``turn`` (0: as seeded); the next turn sees
        it, and publishes the rewind as a ``workspace`` event. Returns that event's data.
        RunBusy while a turn is in flight; InvalidInput, before anything is asked, for a
        turn below 0."""
        check_run_id(run_id)
        _check_snapshot(turn, "turn", required=True)
        record = self.store.get(run_id)
        if record["status"] in IN_FLIGHT:
            raise RunBusy(run_id, record.get("current_turn"))
        if record["status"] in FINISHED:
            raise RunEnded(run_id, record["status"])
        return self.ask(run_id, record.get("queue"), "rewind", _no_data, turn=turn)

    def _queue(self, run_id: str) -> str | None:
        queue: str | None = self.store.get(run_id).get("queue")
        return queue


def _check_snapshot(turn: object, what: str, *, required: bool = False) -> None:
    """InvalidInput unless ``turn`` can name a snapshot: a whole number, 0 or more (0 is
    the workspace before the first turn); None when not ``required``."""
    if turn is None and not required:
        return
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise InvalidInput(
            f"no snapshot after turn {turn!r} ({what}): a snapshot is named by its turn, "
            "0 or more (0: the workspace before the first turn)"
        )


def _unwritable(target: Path, exc: OSError) -> InvalidInput:
    if not target.parent.is_dir():
        why = f"its folder {str(target.parent)!r} does not exist"
    else:
        why = exc.strerror or str(exc)
    return InvalidInput(f"cannot write the export to {str(target)!r}: {why}")


def _writer(out: BinaryIO, target: Path) -> Callable[[bytes], object]:
    """``out.write``, its errors (a full disk) said as the export's."""

    def write(data: bytes) -> object:
        try:
            return out.write(data)
        except OSError as exc:
            raise _unwritable(target, exc) from None

    return write


def _no_data(_: bytes) -> None:
    """A rewind's reply has no data chunks, only its facts."""
