"""The errors of seeding a workspace (re-exported by :mod:`sandbox.store.seeding`)."""

from __future__ import annotations

from sandbox.base import SandboxError


class SeedError(SandboxError):
    """A workspace could not be seeded. The message is safe to show a producer: it never holds
    a credential."""


class ArchiveRefused(SeedError):
    """An archive was refused (the caller maps this to ``invalid-input``); the message names the
    member and the rule it broke. Nothing was written outside the workspace, and what was
    written inside it has been removed."""
