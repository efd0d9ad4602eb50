"""A turn's steps on its run's workspace: seed it before the first turn, snapshot it after
every turn, and publish the rewinds done since the last one.

The workspace lives on the run's host (``<sandbox root>/run/<run_id>`` or a durable one); its
snapshots live beside it, in a store the container never sees (:mod:`sandbox.store.snapshots`). The
git credential of a seed repository is the worker's (``HARNESS_REPO_CREDENTIALS``, read from
its own environment) and only ever reaches the worker's git, through its environment.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from adapters.events import WORKSPACE_LIST_LIMIT, Event, WorkspaceChange
from config import Settings
from sandbox.base import Sandbox, SandboxError
from sandbox.store.seeding import (
    ArchiveLimits,
    SeedError,
    SeedUnreachable,
    check_repo_url,
    git_auth_env,
    seed_from_archive,
    seed_from_repo,
    with_git_config,
)
from sandbox.store.snapshots import SnapshotLimits, SnapshotStore, SnapshotSummary
from sandbox.workspace import make_owned_workspace, parse_user, workspace_dir
from worker.deps import TurnDeps
from worker.errors import InvalidInput
from worker.options.spec import RunOptions
from worker.options.tenant_names import owned
from worker.store.keys import Keys, SyncRedis
from worker.store.records import RecordChanges
from worker.store.transfer import BinaryRedis, binary_client, receive_upload

log = logging.getLogger(__name__)

BASELINE_MESSAGE = "the workspace before the first turn"
LOCK_WAIT_S = 300.0
"""Longest a turn waits for a rewind of its workspace to finish."""


@dataclass(frozen=True)
class RunWorkspace:
    """Where one run's workspace and snapshots are on this host, and who owns them."""

    run_id: str
    path: Path
    store: SnapshotStore
    uid: int
    gid: int
    key: str | None = None
    """A durable workspace's name on the host (the sandbox's ``workspace_key``): its
    tenant's own; None for the run's own workspace."""


def run_workspace(
    sandbox: Sandbox,
    run_id: str,
    options: RunOptions,
    settings: Settings,
    *,
    tenant: str | None,
) -> RunWorkspace:
    """The run's workspace on this host; ``tenant`` the run's (a durable workspace's name is
    that tenant's own: another tenant naming it gets a workspace of its own)."""
    root = sandbox.root
    if sandbox.backend == "docker":
        uid, gid = parse_user(settings.container_user)
    else:
        uid, gid = os.getuid(), os.getgid()
    key = owned(tenant, options.workspace) if options.workspace else None
    return RunWorkspace(
        run_id,
        workspace_dir(root, run_id, key),
        SnapshotStore(root, run_id, snapshot_limits(settings)),
        uid,
        gid,
        key,
    )


def snapshot_limits(settings: Settings) -> SnapshotLimits:
    return SnapshotLimits(
        max_file_bytes=settings.snapshot_max_file_bytes,
        max_total_bytes=settings.snapshot_max_bytes,
        max_files=settings.snapshot_max_files,
        timeout_s=settings.snapshot_timeout_s,
        ignore=settings.snapshot_ignore,
        watch=settings.snapshot_watch,
    )


def repo_env(url: str, settings: Settings) -> dict[str, str]:
    """The git environment carrying the worker's credential for ``url``'s host, if any."""
    host = (urlsplit(url).hostname or "").lower()
    variable = settings.repo_credentials.get(host)
    if not variable:
        return {}
    secret = os.environ.get(variable)
    if not secret:
        raise InvalidInput(
            f"the credential for {host} ({variable}, HARNESS_REPO_CREDENTIALS) is not set "
            "on this worker"
        )
    return git_auth_env(secret)


@dataclass(frozen=True)
class Upload:
    """Where a producer's archive waits: a binary Redis client and the run's upload key."""

    client: BinaryRedis
    key: str


def seed(
    work: RunWorkspace, options: RunOptions, settings: Settings, upload: Upload
) -> SnapshotSummary | None:
    """Fill a first turn's workspace from the run's repository or archive, and take the
    baseline snapshot (turn 0). Idempotent: a first turn tried again finds turn 0 taken.

    Raises InvalidInput (the turn is refused), or SeedUnreachable (the repository could not
    be read now: a later run may succeed); either way nothing is left of the workspace or the
    store.
    """
    if not (options.repo or options.archive or settings.snapshots):
        return None
    if work.store.exists() and 0 in work.store.turns():
        return None
    unseeded = not (options.repo or options.archive)
    if unseeded and not options.workspace:
        # A new run's own workspace, unseeded: empty by construction, recorded without a walk
        # (nor the workspace made here: the sandbox makes it, or a warm one takes its place).
        return _baseline(work, lambda: work.store.take_empty(0, BASELINE_MESSAGE))
    workspace, created, _ = make_owned_workspace(
        work.store.root, work.run_id, work.key, work.uid, work.gid
    )
    if unseeded:
        return _baseline(work, lambda: work.store.take(workspace, 0, BASELINE_MESSAGE))
    try:
        if options.repo:
            _require_empty(workspace, options)
            address = check_repo_url(options.repo, settings.repo_schemes, settings.repo_hosts)
            return seed_from_repo(
                work.store,
                workspace,
                options.repo,
                options.ref,
                repo_env(options.repo, settings),
                work.uid,
                work.gid,
                settings.repo_timeout_s,
                address=address,
            )
        _require_empty(workspace, options)
        return _seed_archive(work, workspace, options, settings, upload)
    except (SandboxError, InvalidInput) as exc:
        work.store.remove()
        if created:
            _remove_workspace(workspace)
        if isinstance(exc, SeedUnreachable):
            raise
        if isinstance(exc, SeedError | InvalidInput):
            raise InvalidInput(str(exc)) from None
        raise InvalidInput(f"the workspace could not be seeded: {exc}") from None


def _seed_archive(
    work: RunWorkspace,
    workspace: Path,
    options: RunOptions,
    settings: Settings,
    upload: Upload,
) -> SnapshotSummary:
    assert options.archive is not None
    with tempfile.TemporaryDirectory(prefix="harness-archive-") as scratch:
        archive = Path(scratch) / "upload"
        with archive.open("wb") as out:
            receive_upload(
                upload.client, upload.key, out, options.archive, settings.archive_max_bytes
            )
        limits = ArchiveLimits(
            max_bytes=settings.archive_max_bytes,
            max_files=settings.archive_max_files,
            max_unpacked_bytes=settings.archive_max_unpacked_bytes,
            max_ratio=settings.archive_max_ratio,
        )
        return seed_from_archive(work.store, workspace, archive, limits, work.uid, work.gid)


def _require_empty(workspace: Path, options: RunOptions) -> None:
    """A durable workspace that already holds work is not overwritten by a seed."""
    if options.workspace and any(p.name != ".home" for p in workspace.iterdir()):
        raise InvalidInput(
            f"the durable workspace {options.workspace!r} already holds files: a seed "
            "(--repo or --archive) needs an empty one"
        )


def _remove_workspace(workspace: Path) -> None:
    shutil.rmtree(workspace, ignore_errors=True)


def _baseline(work: RunWorkspace, take: Callable[[], SnapshotSummary]) -> SnapshotSummary | None:
    """An unseeded run's turn 0. Without it the run goes on: its first turn's snapshot
    records everything."""
    try:
        return take()
    except SandboxError as exc:
        log.warning("workspace.baseline_failed", extra={"run_id": work.run_id, "error": str(exc)})
        return None


def seed_first_turn(
    deps: TurnDeps, run_id: str, work: RunWorkspace, options: RunOptions
) -> RecordChanges | None:
    """Seed the workspace of a run's first turn; what the run record keeps of it.

    The producer's upload is deleted whatever happens (it was only ever for this).
    """
    upload = Upload(binary_client_for(deps.settings.redis_url), deps.keys.upload(run_id))
    try:
        summary = seed(work, options, deps.settings, upload)
    finally:
        if options.archive:
            upload.client.delete(upload.key)
    if summary is None:
        return None
    changes = RecordChanges(snapshot=summary.snapshot)
    if options.repo:
        commit = work.store.seed_commit()
        at = f" (commit {commit[:12]})" if commit else ""
        changes["seed"] = f"{options.repo}@{options.ref or 'HEAD'}{at}"
    elif options.archive:
        changes["seed"] = f"archive sha256:{options.archive}"
    return changes


@functools.lru_cache(maxsize=4)
def binary_client_for(redis_url: str) -> BinaryRedis:
    """One binary Redis client per process (uploads and replies are rare and large)."""
    return binary_client(redis_url)


def wait_for_rewind(redis: SyncRedis, keys: Keys, run_id: str) -> bool:
    """Hold a turn while a rewind rewrites its workspace (bounded: the lock expires). Whether
    rewinds wait to be told in this turn's stream (:func:`take_rewinds`): once the lock is
    gone their list is whole, since a rewind refuses a run with a turn in flight; True when
    the wait ran out with the lock still held (the list may still grow)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    lock, rewinds = keys.workspace_lock(run_id), keys.rewinds(run_id)
    while True:
        pipe = redis.pipeline(transaction=False)
        pipe.exists(lock)
        pipe.exists(rewinds)
        locked, pending = pipe.execute()
        if not locked:
            return bool(pending)
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)


def take_rewinds(redis: SyncRedis, keys: Keys, run_id: str) -> list[Event]:
    """The rewinds done since the last turn, as events, removed from the run's list."""
    key = keys.rewinds(run_id)
    pending = redis.lrange(key, 0, -1)
    if not pending:
        return []
    redis.delete(key)
    return [decode_rewind(text) for text in pending]


def after_turn(
    work: RunWorkspace, turn: int, message: str, options: RunOptions, settings: Settings
) -> WorkspaceChange:
    """Snapshot the workspace after ``turn`` (and push it when the run asks): its event.

    A snapshot that fails is still an event (``complete`` false, ``note`` saying why): the
    turn's terminal event is not held back by it.
    """
    started = time.monotonic()
    try:
        summary = work.store.take(work.path, turn, _first_line(message))
    except SandboxError as exc:
        log.warning("workspace.snapshot_failed", extra={"run_id": work.run_id, "error": str(exc)})
        return WorkspaceChange(snapshot="", complete=False, note=f"no snapshot: {exc}")
    pushed, note = None, summary.note or None
    if options.push_branch and options.repo:
        try:
            # Checked again, and held to the address checked now: the host's name may point
            # elsewhere than when the run was seeded.
            address = check_repo_url(options.repo, settings.repo_schemes, settings.repo_hosts)
            env = with_git_config(repo_env(options.repo, settings), address.git_config())
            work.store.push(options.repo, options.push_branch, turn, env)
            pushed = options.push_branch
        except (SandboxError, InvalidInput) as exc:
            log.warning("workspace.push_failed", extra={"run_id": work.run_id, "error": str(exc)})
            note = f"{note + '; ' if note else ''}push to {options.push_branch} failed: {exc}"
    log.info(
        "workspace.snapshot",
        extra={
            "run_id": work.run_id,
            "turn": turn,
            "changed": len(summary.added) + len(summary.modified) + len(summary.deleted),
            "ms": round((time.monotonic() - started) * 1000),
        },
    )
    return change_event(summary, note=note, pushed_branch=pushed)


def change_event(
    summary: SnapshotSummary, *, note: str | None = None, pushed_branch: str | None = None
) -> WorkspaceChange:
    limit = WORKSPACE_LIST_LIMIT
    return WorkspaceChange(
        snapshot=summary.snapshot,
        added=summary.added[:limit],
        modified=summary.modified[:limit],
        deleted=summary.deleted[:limit],
        added_count=len(summary.added),
        modified_count=len(summary.modified),
        deleted_count=len(summary.deleted),
        lines_added=summary.lines_added,
        lines_removed=summary.lines_removed,
        large=summary.large[:limit],
        complete=summary.complete,
        note=note if note is not None else (summary.note or None),
        rewound_to=summary.rewound_to,
        pushed_branch=pushed_branch,
    )


def encode_rewind(summary: SnapshotSummary) -> str:
    """A rewind as the run's list of pending rewinds keeps it (the next turn publishes it)."""
    return change_event(summary).data_json()


def decode_rewind(text: str) -> WorkspaceChange:
    return WorkspaceChange(**json.loads(text))


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(empty input)"
    return line[:200]
