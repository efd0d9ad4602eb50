"""A worker's turn dependencies in this test process (real Redis, the local sandbox, the demo
harness), for tests that drive a turn's parts themselves: a claim, a publisher, the one
terminal writer, the run's end."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from config import load_settings
from sandbox.local import LocalSandbox
from worker.client import HarnessClient
from worker.deps import Shutdown, TurnDeps
from worker.store.keys import Keys
from worker.store.records import RunStore

DEMO_SCRIPT = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"
SendTurn = Callable[[dict[str, Any], str, float], None]


@contextlib.contextmanager
def turn_deps(
    tmp_path: Path,
    redis_url: str,
    stem: str,
    *,
    send_turn: SendTurn = lambda payload, queue, countdown: None,
    **settings: Any,
) -> Iterator[tuple[TurnDeps, HarnessClient, str]]:
    """Dependencies under a fresh key prefix (``stem`` and random hex), a client of theirs and
    the demo harness's executable; every key and sandbox they made is gone afterwards."""
    prefix = stem + os.urandom(4).hex()
    wrapper = tmp_path / "harness-demo"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO_SCRIPT}" "$@"\n')
    wrapper.chmod(0o755)
    loaded = load_settings(
        redis_url=redis_url,
        sandbox="local",
        key_prefix=prefix,
        workspace_root=str(tmp_path),
        allowed_executables=("*",),
        snapshots=False,
        exit_grace_s=1.0,
        kill_grace_s=0.2,
        **settings,
    )
    client = HarnessClient(loaded)
    sandbox = LocalSandbox(tmp_path / "local")
    keys = Keys(prefix)
    deps = TurnDeps(
        settings=loaded,
        redis=client.redis,
        keys=keys,
        store=RunStore(client.redis, keys, loaded.retention_s),
        sandbox_for=lambda backend: sandbox,
        worker_id=f"{stem}-host:1",
        shutdown=Shutdown(loaded.shutdown_grace_s),
        send_turn=send_turn,
    )
    try:
        yield deps, client, str(wrapper)
    finally:
        for found in sandbox.managed():
            sandbox.teardown(found.run_id)
        raw = redis.Redis.from_url(redis_url)
        for key in raw.scan_iter(f"{prefix}:*"):
            raw.delete(key)
        client.close()
