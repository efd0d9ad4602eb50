"""The worker acts on capabilities: execute_turn with fakeredis, LocalSandbox and the demo
harness (stdio-json: no system-prompt channel, no model selection, no permission policy)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import fakeredis
import pytest

import adapters
from config import load_settings
from sandbox.local import LocalSandbox
from worker.keys import Keys
from worker.records import RunStore
from worker.spec import RunOptions, TurnPayload, new_run_id
from worker.turn import Shutdown, TurnDeps, execute_turn

DEMO = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"
PREFIX = "ct"


@pytest.fixture
def turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``turn(text, **options)``: one stdio-json turn run to its end; returns (terminal data,
    run record)."""
    for name in list(os.environ):
        if name.startswith("HARNESS_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    wrapper = tmp_path / "harness-demo"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    settings = load_settings(
        sandbox="local",
        key_prefix=PREFIX,
        workspace_root=str(tmp_path),
        allowed_executables=("*",),
        exit_grace_s=1.0,
        kill_grace_s=0.2,
    )
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys(PREFIX)
    store = RunStore(client, keys, settings.retention_s)
    sandbox = LocalSandbox(tmp_path / "local")
    deps = TurnDeps(
        settings=settings,
        redis=client,
        keys=keys,
        store=store,
        sandbox_for=lambda backend: sandbox,
        worker_id="test-host:1",
        shutdown=Shutdown(settings.shutdown_grace_s),
    )

    def run(text: str, **options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        run_id = new_run_id()
        options = {"harness": "stdio-json", "executable": str(wrapper), **options}
        store.create(run_id, RunOptions(sandbox="local", **options), queue="q", sandbox="local")
        execute_turn(deps, TurnPayload(run_id=run_id, turn=1, input=text))
        entries = client.xrange(keys.events(run_id))
        terminal = json.loads(entries[-1][1]["data"])
        assert entries[-1][1]["type"] == "turn-complete", terminal
        return terminal, store.get(run_id)

    yield run
    for found in sandbox.managed():
        sandbox.teardown(found.run_id)


@pytest.mark.parametrize("has_channel", [False, True])
def test_system_prompt_without_a_channel_reaches_the_harness_in_its_input(
    turn: Any, monkeypatch: pytest.MonkeyPatch, has_channel: bool
) -> None:
    adapter = adapters.get("stdio-json")
    caps = dataclasses.replace(adapter.CAPABILITIES, system_prompt=has_channel)
    monkeypatch.setattr(adapter, "CAPABILITIES", caps)
    done, _ = turn("hello", system_prompt="SYS-MARK-9d")
    # The demo answers "You said: <its input>". Declared as a channel the adapter does not
    # have, the prompt would be lost: the flag is what puts it in the input.
    assert ("SYS-MARK-9d" in done["text"]) is not has_channel
    assert done["text"].endswith("hello")


def test_what_the_harness_cannot_apply_is_in_the_run_record(turn: Any) -> None:
    _, record = turn("hello", model="demo-9", posture="strict", deny=("Bash(rm *)",))
    warnings = record["warnings"]
    assert len(warnings) == 2, warnings
    assert "enforces no permission policy" in warnings[0]
    assert "model_selection" in warnings[1] and "demo-9" in warnings[1]
