"""Every git process the worker starts, with a hardened environment and configuration.

The worker runs as root and keeps its records in git, next to workspaces that agents control.
So no git process reads configuration, hooks or attributes from anywhere an agent can write:

- the environment is built from nothing (never the worker's own, which holds secrets): no
  system or global config (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``), ``HOME``
  an empty directory owned by the worker, no terminal prompt, no askpass;
- ``-c`` options switch off hooks (``core.hooksPath=/dev/null``), fsmonitor, credential
  helpers, the ``ext::`` transport, redirects (a redirect could lead a fetch to a host the URL
  policy refused), automatic gc and submodule recursion, and check every object received;
- a store's ``info/attributes`` (see :data:`NEUTRAL_ATTRIBUTES`) takes precedence over any
  ``.gitattributes`` inside a tree, so no tree can name a filter, textconv or export rule.

Credentials reach git only through ``extra_env`` (``GIT_CONFIG_COUNT``/``KEY_n``/``VALUE_n``),
never argv; error messages pass through :func:`redact` first.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox.base import GitError

HARDENING: tuple[str, ...] = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
    "-c", "core.autocrlf=false",
    "-c", "core.symlinks=true",
    "-c", "core.askPass=",
    "-c", "credential.helper=",
    "-c", "protocol.ext.allow=never",
    "-c", "http.followRedirects=false",
    "-c", "transfer.fsckObjects=true",
    "-c", "fetch.recurseSubmodules=false",
    "-c", "submodule.recurse=false",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "diff.external=",
    "-c", "core.quotePath=false",
)  # fmt: skip
"""Options given to every git process; the order matters only in that they come first."""

NEUTRAL_ATTRIBUTES = (
    "* !diff !text !eol !filter !ident !export-ignore !export-subst !working-tree-encoding !merge\n"
)
"""A store's ``info/attributes``: every attribute a tree could set is reset to unspecified."""


def git_env(home: Path, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a git process: nothing inherited but PATH."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_ATTR_NOSYSTEM": "1",
    }
    env.update(extra_env or {})
    return env


def empty_home(root: Path) -> Path:
    """A worker-owned, empty directory to serve as git's HOME."""
    home = root / ".git-home"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def redact(text: str, env: Mapping[str, str] | None) -> str:
    """``text`` with every credential value of ``env`` (config values) replaced."""
    for key, value in (env or {}).items():
        if key.startswith("GIT_CONFIG_VALUE_") and value:
            text = text.replace(value, "[redacted]")
            # A Basic header's token alone, should git echo only that part.
            token = value.rsplit(" ", 1)[-1]
            if len(token) >= 8:
                text = text.replace(token, "[redacted]")
    return text


def git_argv(git_dir: Path | None, args: Sequence[str]) -> list[str]:
    base = ["git", *HARDENING]
    if git_dir is not None:
        base.append(f"--git-dir={git_dir}")
    return [*base, *args]


def run_git(
    git_dir: Path | None,
    args: Sequence[str],
    *,
    home: Path,
    input: bytes | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    cwd: Path | None = None,
) -> bytes:
    """Run git and return its stdout; :class:`GitError` on failure or timeout."""
    argv = git_argv(git_dir, args)
    try:
        done = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            env=git_env(home, extra_env),
            timeout=timeout_s,
            check=False,
            cwd=cwd or home,
        )
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"git {args[0]} timed out after {timeout_s:g} s") from exc
    except OSError as exc:
        raise GitError(f"cannot run git: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip()[-800:]
        raise GitError(redact(f"git {args[0]} failed: {tail}", extra_env))
    return done.stdout


def popen_git(
    git_dir: Path | None,
    args: Sequence[str],
    *,
    home: Path,
    stdin: int | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A streaming git process (stdout piped, stderr piped); the caller owns killing it."""
    try:
        return subprocess.Popen(
            git_argv(git_dir, args),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=git_env(home, extra_env),
            cwd=home,
        )
    except OSError as exc:
        raise GitError(f"cannot run git: {exc.strerror or exc}") from exc
