"""``celery -A tests.security.scoped_app worker``: the real worker app, with one change.

Its Docker sandbox labels containers with a scope of their own, the deployment's key prefix,
so that no other deployment on this daemon (another engineer's test worker, say) reaps the
containers of these tests, and these tests' workers reap nobody else's. ``worker.runtime``
creates ``DockerSandbox`` with the default scope, shared by every deployment: see
docs/security.md ("What is not enforced").
"""

from __future__ import annotations

from pathlib import Path

from config import Settings
from sandbox.base import Sandbox
from worker import runtime

_make_sandbox = runtime.make_sandbox


def _scoped_sandbox(backend: str, settings: Settings) -> Sandbox:
    if backend == "docker":
        from sandbox.docker.sandbox import DockerSandbox

        sandbox: Sandbox = DockerSandbox(
            Path(settings.workspace_root) / "docker",
            base_url=settings.docker_url,
            scope=settings.key_prefix,
        )
        return sandbox
    return _make_sandbox(backend, settings)


runtime.make_sandbox = _scoped_sandbox

from worker.app import app  # noqa: E402 -- after the patch, so every sandbox is scoped

__all__ = ["app"]
