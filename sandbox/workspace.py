"""A run's workspace on the host, for both backends: its name, its owner and its lease file.

Under a backend's root, a run-scoped workspace is ``run/<run_id>`` and a durable one, shared
across runs for cross-run resume, is ``durable/<workspace_key>``; HOME is its ``.home``.
Every name that becomes part of a path passes :func:`safe_name` first.

A lease file, ``<root>/leases/<run_id>.json``, lies outside the workspace so that a harness
cannot extend its own lease.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from sandbox.base import SandboxError
from sandbox.small_files import rewrite_in_place

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def safe_name(value: str, what: str) -> str:
    """Refuse anything that could leave its directory or confuse a path."""
    if not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise SandboxError(f"invalid {what} {value!r}: use letters, digits, '_', '.', '-'")
    return value


def parse_user(user: str) -> tuple[int, int]:
    """The uid and gid of a container user (``uid`` or ``uid:gid``), who owns its workspace;
    SandboxError for anything else, root included."""
    uid_text, _, gid_text = user.partition(":")
    try:
        uid = int(uid_text)
        gid = int(gid_text) if gid_text else uid
    except ValueError:
        raise SandboxError(
            f"invalid container user {user!r}: use a numeric uid or uid:gid such as 1000:1000"
        ) from None
    if uid == 0 or gid == 0:
        raise SandboxError(f"refusing to run the harness as root (user {user!r})")
    return uid, gid


def workspace_dir(root: Path, run_id: str, workspace_key: str | None = None) -> Path:
    """The run's workspace: durable when it has a workspace key, else its own."""
    if workspace_key:
        return root / "durable" / safe_name(workspace_key, "workspace key")
    return root / "run" / safe_name(run_id, "run id")


def make_owned_workspace(
    root: Path, run_id: str, workspace_key: str | None, uid: int, gid: int
) -> tuple[Path, bool, bool]:
    """Create the workspace and its HOME owned by ``uid:gid``: (path, created, fresh HOME)."""
    workspace = workspace_dir(root, run_id, workspace_key)
    home = workspace / ".home"
    created = not workspace.exists()
    try:
        # The harness controls everything inside the workspace: a .home it replaced with
        # a symlink (or a file) must never lead this root-run worker to a host path.
        if home.is_symlink() or (home.exists() and not home.is_dir()):
            home.unlink()
        fresh_home = not home.exists()
        home.mkdir(parents=True, exist_ok=True)
        for path in (workspace, home):
            own(path, uid, gid)
    except OSError as exc:
        raise SandboxError(
            f"cannot create the workspace {workspace}: {exc.strerror or exc}",
            hint="check that the workspace root is writable by the worker",
        ) from exc
    return workspace, created, fresh_home


def own(path: Path, uid: int, gid: int) -> None:
    stat = path.lstat()
    if (stat.st_uid, stat.st_gid) == (uid, gid):
        return
    try:
        os.chown(path, uid, gid, follow_symlinks=False)
    except PermissionError:
        # A worker that is neither root nor the container's uid cannot hand the directory
        # over; opening it up is the only way the container user can write to it.
        os.chmod(path, 0o777)
        log.warning(
            "sandbox.workspace_not_owned",
            extra={"path": str(path), "uid": uid, "hint": "run the worker as root or uid"},
        )


class LeaseFiles:
    """Each run's lease as ``<root>/leases/<run_id>.json``, rewritten in place on renewal (a
    reaper that cannot read it takes the later of the container's label and the run's record,
    worker/fleet/lifecycle.py)."""

    def __init__(self, root: Path) -> None:
        self.directory = root / "leases"

    def path(self, run_id: str) -> Path:
        return self.directory / f"{safe_name(run_id, 'run id')}.json"

    def write(self, run_id: str, lease_until: float) -> None:
        """Record the lease; a failure is logged, not raised (the label lease still holds)."""
        path = self.path(run_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            rewrite_in_place(
                path, json.dumps({"run_id": run_id, "lease_until": lease_until}).encode()
            )
        except OSError as exc:
            log.warning("sandbox.renew_failed", extra={"run_id": run_id, "error": str(exc)})

    def read(self, run_id: str) -> float | None:
        try:
            value = json.loads(self.path(run_id).read_text()).get("lease_until")
        except (OSError, ValueError, AttributeError, SandboxError):
            return None
        return float(value) if isinstance(value, int | float) else None

    def remove(self, run_id: str) -> None:
        self.path(run_id).unlink(missing_ok=True)
