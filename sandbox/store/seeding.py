"""Work in: a run's workspace seeded from a git repository or an archive, then snapshot turn 0.

**Repository.** The caller checks the URL against operator policy first
(:func:`check_repo_url`). The seed is fetched into the run's snapshot store (a bare repository
the worker owns, :mod:`sandbox.store.snapshots`), never into the workspace: ``git ls-remote`` finds
the ref (a branch, a tag, or a full commit id), ``git fetch --depth=1`` brings that one commit
(a server that refuses a shallow fetch by id gets a full fetch), every object checked, no
submodule, no tag followed, within ``timeout_s``. Credentials travel only in the environment
the caller gives (:func:`git_auth_env`): never argv, never written to any config, and every
error message is redacted. Then the commit's tree is written into the fresh workspace with
:class:`sandbox.store.safe_fs.SafeWriter` (ignored paths such as ``.home`` are not written), and the
workspace gets a ``.git`` of its own so the agent can use git: the seed's objects (copied),
``HEAD`` on the branch (detached for a tag or a commit), ``origin`` = the credential-free URL,
an index matching the files, and ``info/exclude`` hiding ``/.home/``. Snapshot turn 0 has the
seed commit as its parent, so a pushed branch builds on the seed's history. Any failure
removes the store and whatever was written into the workspace, and raises :class:`SeedError`.

**Archive.** :func:`seed_from_archive`: :func:`sandbox.store.archives.extract_archive` (every rule
is listed there), then snapshot turn 0.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import os
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from sandbox.addresses import resolve_public
from sandbox.base import (
    AddressRefused,
    ArchiveRefused,
    GitError,
    SeedError,
    SeedUnreachable,
    SnapshotError,
    Unresolvable,
    UnsafePath,
)
from sandbox.store.archives import ArchiveLimits, extract_archive, list_names_of
from sandbox.store.git_objects import BlobReader, ls_tree
from sandbox.store.git_run import empty_home, redact, run_git
from sandbox.store.safe_fs import SafeWriter
from sandbox.store.scan import MODE_EXEC, MODE_FILE, MODE_LINK, Entry, blob_id, stamp
from sandbox.store.snapshots import SEED, SnapshotStore, SnapshotSummary

__all__ = [
    "ArchiveLimits",
    "ArchiveRefused",
    "RepoAddress",
    "SeedError",
    "SeedUnreachable",
    "check_repo_url",
    "extract_archive",
    "git_auth_env",
    "seed_from_archive",
    "seed_from_repo",
    "take_baseline",
    "with_git_config",
]

_FULL_ID = re.compile(r"[0-9a-f]{40}")


# -- policy ------------------------------------------------------------------------------

_HTTP_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class RepoAddress:
    """Where a URL policy allowed is to be reached: the addresses its host's check resolved.

    Empty ``addresses``: reached as named (a host the operator names, an IP literal, a file
    URL). Otherwise git must connect to these and only these (:meth:`git_config`): a second
    lookup of the name could answer otherwise (DNS rebinding)."""

    host: str = ""
    port: int = 0
    addresses: tuple[str, ...] = ()

    def git_config(self) -> tuple[tuple[str, str], ...]:
        """git configuration making its HTTP connections to the host go to the checked
        addresses (libcurl's ``CURLOPT_RESOLVE``); both spellings of a name with a trailing
        dot are pinned, since the URL keeps it."""
        if not self.addresses:
            return ()
        if git_version() < (2, 37):
            raise SeedError(
                "this worker's git is older than 2.37 and cannot be held to the address the "
                f"host {self.host!r} was checked at; name the host in the policy to allow it"
            )
        joined = ",".join(f"[{a}]" if ":" in a else a for a in self.addresses)
        names = dict.fromkeys((self.host, self.host.rstrip(".")))
        return tuple(("http.curloptResolve", f"{name}:{self.port}:{joined}") for name in names)


def check_repo_url(
    url: str, schemes: Collection[str], hosts: Collection[str], *, resolve: bool = True
) -> RepoAddress:
    """Refuse (:class:`SeedError`) a URL operator policy does not allow; return where its
    host is to be reached (pass it to :func:`seed_from_repo` and :func:`with_git_config`).

    ``schemes``: allowed schemes (``https`` is the usual one; ``file`` only for tests).
    ``hosts``: allowed host names, or ``*`` for any host. A host named explicitly is trusted
    as named; any other host must resolve only to public addresses
    (:func:`sandbox.addresses.is_public`: no loopback, private, link-local - the cloud
    metadata address among them -, multicast or reserved one, nor an IPv6 form carrying
    one), and is then reached at exactly those addresses, so only over HTTP(S) (git's other
    transports cannot be held to an address). Credentials in the URL are refused: they are
    granted, never part of a URL that ends up in ``.git/config``. Blocking (it resolves the
    host); :class:`SeedUnreachable` when the host does not resolve.

    ``resolve=False``: the host's addresses are left to whoever connects, which must check
    the address it connects to (the API's webhook client does, worker/api/outbound.py).
    """
    scheme, named, port = _parse(url, schemes)
    if scheme == "file":
        return RepoAddress()
    host = named.rstrip(".")
    allowed_hosts = {h.lower().rstrip(".") for h in hosts}
    if host in allowed_hosts:
        return RepoAddress()
    if "*" not in allowed_hosts:
        raise SeedError(f"the host {host!r} is not allowed (allowed: {', '.join(sorted(hosts))})")
    if scheme not in _HTTP_PORTS:
        raise SeedError(
            f"a {scheme}:// repository is reached only on a host named in the policy (git "
            "cannot be held to the address a host was checked at but over http and https)"
        )
    port = port or _HTTP_PORTS[scheme]
    if not resolve:
        return RepoAddress()
    try:
        found = resolve_public(host, port)
    except AddressRefused as exc:
        raise SeedError(f"{exc}; name the host in the policy to allow it") from None
    except Unresolvable as exc:
        raise SeedUnreachable(str(exc)) from None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return RepoAddress(named, port, tuple(str(a) for a in found))
    return RepoAddress()  # an IP literal: git connects to it, no name to look up again


def _parse(url: str, schemes: Collection[str]) -> tuple[str, str, int | None]:
    """The scheme, host (lower case, as spelt) and port of a URL that has the shape policy
    asks for: an allowed scheme, no credentials, a host (none for ``file``)."""
    if any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in url):
        raise SeedError("the repository URL holds whitespace or control characters")
    if "://" not in url:
        raise SeedError(
            "the repository must be a URL with a scheme (scp-like addresses are refused)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SeedError(f"the repository URL is not valid: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in {s.lower() for s in schemes}:
        allowed = ", ".join(sorted(schemes)) or "none"
        raise SeedError(f"the URL scheme {scheme!r} is not allowed (allowed: {allowed})")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise SeedError("the repository URL holds credentials: grant them instead")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SeedError("a file URL names no host")
        return scheme, "", None
    named = (parts.hostname or "").lower()
    if not named.rstrip("."):
        raise SeedError("the repository URL names no host")
    return scheme, named, port


@functools.lru_cache(maxsize=1)
def git_version() -> tuple[int, ...]:
    """This host's git version (``(0,)`` if it cannot say)."""
    try:
        out = run_git(None, ["version"], home=Path("/"), timeout_s=30)
    except GitError:
        return (0,)
    found = re.search(rb"(\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else (0,)


def with_git_config(env: Mapping[str, str], config: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``env`` (a git environment, :func:`git_auth_env`'s or empty) with ``config`` added
    to what it gives git through ``GIT_CONFIG_COUNT``."""
    merged = dict(env)
    count = int(merged.get("GIT_CONFIG_COUNT", "0"))
    for key, value in config:
        merged[f"GIT_CONFIG_KEY_{count}"] = key
        merged[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    if count:
        merged["GIT_CONFIG_COUNT"] = str(count)
    return merged


def git_auth_env(secret: str) -> dict[str, str]:
    """The environment that gives git a credential as an HTTP ``Authorization`` header.

    ``user:password`` is used as given; a bare token is sent as ``x-access-token:<token>``
    (accepted by the common forges). Config through ``GIT_CONFIG_COUNT``: never argv, never
    written to a file.
    """
    userpass = secret if ":" in secret else f"x-access-token:{secret}"
    token = base64.b64encode(userpass.encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {token}",
    }


# -- repository --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ref:
    kind: Literal["branch", "tag", "commit", "head"]
    name: str
    """Branch or tag name (empty for a commit or a detached remote HEAD)."""
    refname: str
    """What to fetch: a full ref name or a commit id."""


def seed_from_repo(
    store: SnapshotStore,
    workspace: Path,
    url: str,
    ref: str | None,
    env: Mapping[str, str],
    uid: int,
    gid: int,
    timeout_s: float,
    *,
    address: RepoAddress | None = None,
) -> SnapshotSummary:
    """Fetch ``ref`` (default: the remote HEAD) of ``url`` into the store, write it into the
    fresh ``workspace`` with a working ``.git``, and take snapshot turn 0. ``url`` must have
    passed :func:`check_repo_url`, and ``address`` be what it returned: git reaches the host
    there and nowhere else.

    :class:`SeedUnreachable` when the repository could not be read now (worth retrying),
    :class:`SeedError` for the rest; either way nothing is left behind."""
    if store.exists() and store.turns():
        raise SeedError(f"run {store.run_id} already has snapshots; it cannot be seeded again")
    deadline = time.monotonic() + timeout_s
    before = set(list_names_of(workspace))
    try:
        env = with_git_config(env, (address or RepoAddress()).git_config())
        store.init()
        chosen = _choose_ref(store, url, ref, env, deadline)
        commit = _fetch(store, url, chosen, env, deadline)
        _materialize(store, workspace, commit, uid, gid)
        _write_dot_git(store, workspace, url, chosen, commit, uid, gid, deadline)
        label = chosen.name or commit[:12]
        return store.take(workspace, 0, f"seed: {url} at {label}")
    except (SeedError, GitError, SnapshotError, UnsafePath, OSError) as exc:
        _clean_up(store, workspace, before, uid, gid)
        if isinstance(exc, SeedError):
            raise
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SeedError(redact(f"cannot seed from {url}: {text}", env)) from None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SeedUnreachable("seeding ran out of time")
    return left


_NOT_THERE = (
    "not found",
    "does not appear to be a git repository",
    "Authentication failed",
    "could not read Username",
    "returned error: 401",
    "returned error: 403",
    "returned error: 404",
    "returned error: 410",
)
"""git's words for a repository that is not there for us (wrong URL, no access): the
producer's to fix, not worth retrying. Any other failure to read a remote is the network's
or the server's (unreachable, reset, timed out, a 5xx): worth retrying."""


def _read_failed(text: str, exc: GitError, env: Mapping[str, str]) -> SeedError:
    message = redact(f"{text}: {exc}", env)
    if "timed out" not in str(exc) and any(word in str(exc) for word in _NOT_THERE):
        return SeedError(message)
    return SeedUnreachable(message)


def _git(
    store: SnapshotStore, args: list[str], env: Mapping[str, str] | None, deadline: float
) -> bytes:
    return run_git(
        store.path, args, home=store_home(store), extra_env=env, timeout_s=_remaining(deadline)
    )


def store_home(store: SnapshotStore) -> Path:
    return empty_home(store.root / "snapshots")


def _choose_ref(
    store: SnapshotStore, url: str, ref: str | None, env: Mapping[str, str], deadline: float
) -> _Ref:
    try:
        out = _git(store, ["ls-remote", "--symref", url], env, deadline)
    except GitError as exc:
        raise _read_failed(f"cannot read the repository {url}", exc, env) from None
    refs: dict[str, str] = {}
    head_target = ""
    for line in out.decode("utf-8", "replace").splitlines():
        left, _, name = line.partition("\t")
        if left.startswith("ref: ") and name == "HEAD":
            head_target = left[5:]
        elif name:
            refs[name] = left
    if ref is None:
        if head_target.startswith("refs/heads/"):
            return _Ref("branch", head_target.removeprefix("refs/heads/"), head_target)
        if "HEAD" in refs:
            return _Ref("head", "", "HEAD")
        raise SeedError(f"the repository {url} has no default branch; name a ref")
    if ref.startswith("-"):
        raise SeedError(f"invalid ref {ref!r}")
    for kind, prefix in (("branch", "refs/heads/"), ("tag", "refs/tags/")):
        if prefix + ref in refs:
            return _Ref(kind, ref, prefix + ref)  # type: ignore[arg-type]
    if ref.startswith("refs/heads/") and ref in refs:
        return _Ref("branch", ref.removeprefix("refs/heads/"), ref)
    if _FULL_ID.fullmatch(ref):
        return _Ref("commit", "", ref)
    raise SeedError(f"the repository {url} has no branch, tag or commit named {ref!r}")


def _fetch(
    store: SnapshotStore, url: str, chosen: _Ref, env: Mapping[str, str], deadline: float
) -> str:
    """Fetch the chosen commit into the store; ``refs/harness/seed`` names it. Packs are kept
    as packs (``transfer.unpackLimit=1``) so they can be copied into the workspace's .git.

    A shallow fetch first; a server that cannot do one (dumb HTTP, which serves files and
    has no shallow capability; a commit it does not advertise) gets a full fetch: of the
    ref, or of every branch for a commit id."""
    base = ["-c", "transfer.unpackLimit=1", "fetch", "--quiet", "--no-tags"]
    base += ["--no-recurse-submodules", "--no-write-fetch-head"]
    target = "refs/harness/fetched"
    try:
        _git(store, [*base, "--depth=1", url, f"+{chosen.refname}:{target}"], env, deadline)
    except GitError as exc:
        if not _no_shallow(exc, chosen):
            raise _read_failed(f"cannot fetch {chosen.refname} from {url}", exc, env) from None
        if chosen.kind == "commit":
            spec, target = "+refs/heads/*:refs/harness/all/heads/*", chosen.refname
        else:
            spec = f"+{chosen.refname}:{target}"
        try:
            _git(store, [*base, url, spec], env, deadline)
        except GitError as again:
            raise _read_failed(f"cannot fetch from {url}", again, env) from None
    try:
        commit = _git(store, ["rev-parse", "--verify", f"{target}^{{commit}}"], None, deadline)
    except GitError:
        raise SeedError(f"the repository {url} has no commit {chosen.refname}") from None
    seed = commit.decode().strip()
    _git(store, ["update-ref", SEED, seed], None, deadline)
    for name in _git(
        store, ["for-each-ref", "--format=%(refname)", "refs/harness/"], None, deadline
    ).split():
        if name.decode() != SEED:
            _git(store, ["update-ref", "-d", name.decode()], None, deadline)
    return seed


def _no_shallow(exc: GitError, chosen: _Ref) -> bool:
    """Whether a shallow fetch failed for want of a server that can do it (then a full one
    may succeed), not for want of a network."""
    text = str(exc)
    if "does not support shallow" in text:  # git's dumb HTTP transport, any version
        return True
    # A commit id the server does not advertise: refused as "not our ref", "unadvertised
    # object" or otherwise, depending on the server; a full fetch finds it, if it exists.
    return chosen.kind == "commit" and "timed out" not in text


def _materialize(store: SnapshotStore, workspace: Path, commit: str, uid: int, gid: int) -> None:
    tree = ls_tree(store.path, commit, store_home(store), store.limits.timeout_s)
    with BlobReader(store.path, store_home(store)) as blobs, SafeWriter(workspace, uid, gid) as w:
        for path in sorted(tree):
            if store.rules.ignored_path(path):
                continue
            entry = tree[path]
            data = blobs.read(entry.oid)
            if entry.mode == MODE_LINK:
                w.symlink(path, data.decode("utf-8", "surrogateescape"))
            else:
                w.write_file(path, (data,), entry.mode == MODE_EXEC)


def _write_dot_git(
    store: SnapshotStore,
    workspace: Path,
    url: str,
    chosen: _Ref,
    commit: str,
    uid: int,
    gid: int,
    deadline: float,
) -> None:
    """The workspace's own ``.git``: written file by file, nothing shared with the store."""
    index = store.path / "seed-index"
    index.unlink(missing_ok=True)
    # The index is built with the store as GIT_DIR (our config, our attributes) while the
    # workspace is still only what we wrote: no agent has touched it yet.
    run_git(
        store.path,
        [f"--work-tree={workspace}", "read-tree", commit],
        home=store_home(store),
        extra_env={"GIT_INDEX_FILE": str(index)},
        timeout_s=_remaining(deadline),
    )
    run_git(
        store.path,
        [f"--work-tree={workspace}", "update-index", "-q", "--refresh"],
        home=store_home(store),
        extra_env={"GIT_INDEX_FILE": str(index)},
        timeout_s=_remaining(deadline),
    )
    files: dict[str, bytes] = {
        "index": index.read_bytes(),
        "info/exclude": b"/.home/\n",
        "description": b"seeded by harness-worker\n",
        "config": _config(url, chosen).encode(),
    }
    index.unlink()
    if chosen.kind == "branch":
        files["HEAD"] = f"ref: refs/heads/{chosen.name}\n".encode()
        files[f"refs/heads/{chosen.name}"] = f"{commit}\n".encode()
        files[f"refs/remotes/origin/{chosen.name}"] = f"{commit}\n".encode()
    else:
        files["HEAD"] = f"{commit}\n".encode()
        if chosen.kind == "tag":
            files[f"refs/tags/{chosen.name}"] = f"{commit}\n".encode()
    shallow = store.path / "shallow"
    if shallow.is_file():
        files["shallow"] = shallow.read_bytes()
    objects = store.path / "objects"
    for directory, _, names in os.walk(objects):
        for name in names:
            source = Path(directory) / name
            relative = source.relative_to(store.path).as_posix()
            if relative.startswith("objects/info/") or name.startswith("tmp_"):
                continue
            files[relative] = source.read_bytes()
    with SafeWriter(workspace, uid, gid) as writer:
        for directory in ("refs/tags", "refs/heads", "objects/info", "objects/pack"):
            writer.directory(f".git/{directory}")
        for relative, data in sorted(files.items()):
            writer.write_file(f".git/{relative}", (data,), False)


def _config(url: str, chosen: _Ref) -> str:
    quoted = url.replace("\\", "\\\\").replace('"', '\\"')
    lines = [
        "[core]",
        "\trepositoryformatversion = 0",
        "\tfilemode = true",
        "\tbare = false",
        "\tlogallrefupdates = true",
        '[remote "origin"]',
        f'\turl = "{quoted}"',
        "\tfetch = +refs/heads/*:refs/remotes/origin/*",
    ]
    if chosen.kind == "branch":
        lines += [
            f'[branch "{chosen.name}"]',
            "\tremote = origin",
            f"\tmerge = refs/heads/{chosen.name}",
        ]
    return "\n".join(lines) + "\n"


def _clean_up(store: SnapshotStore, workspace: Path, before: set[str], uid: int, gid: int) -> None:
    """Nothing left behind: the store, and every top-level entry seeding added."""
    store.remove()
    try:
        with SafeWriter(workspace, uid, gid) as writer:
            for name in set(list_names_of(workspace)) - before:
                writer.remove(name)
    except (UnsafePath, OSError):
        pass


# -- archive and baseline ----------------------------------------------------------------


def seed_from_archive(
    store: SnapshotStore,
    workspace: Path,
    archive: Path,
    limits: ArchiveLimits,
    uid: int,
    gid: int,
) -> SnapshotSummary:
    """Unpack ``archive`` into the fresh ``workspace`` (refused with :class:`ArchiveRefused`,
    nothing left behind) and take snapshot turn 0. Each file's blob is stored while it is
    written, so turn 0 reads back none of them."""
    existed = store.exists()
    fresh: dict[str, Entry] = {}
    try:
        with store.add_blobs() as sink:

            def seen(path: str, executable: bool, data: bytes, st: os.stat_result) -> None:
                oid = blob_id(data)
                sink(oid, data)
                mode = MODE_EXEC if executable else MODE_FILE
                fresh[path] = Entry(mode, oid, len(data), *stamp(st))

            extract_archive(archive, workspace, limits, uid, gid, seen, store.limits.max_file_bytes)
    except ArchiveRefused:
        if not existed:
            store.remove()
        raise
    except SnapshotError as exc:
        raise SeedError(f"cannot store the seeded workspace: {exc}") from exc
    try:
        return store.take(workspace, 0, "seed: archive", fresh=fresh)
    except SnapshotError as exc:
        raise SeedError(f"cannot snapshot the seeded workspace: {exc}") from exc


def take_baseline(store: SnapshotStore, workspace: Path) -> SnapshotSummary:
    """Snapshot turn 0 of a workspace that was not seeded (empty, or a durable one)."""
    return store.take(workspace, 0, "baseline")
