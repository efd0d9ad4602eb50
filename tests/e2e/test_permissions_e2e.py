"""``--posture ask`` end to end: ``harness run --posture ask --follow`` → Celery → worker →
Docker (the CLI's stdin held open through the exec) → Redis, answered with ``harness
approve``/``deny`` from another process, for each harness whose adapter asks live."""

from __future__ import annotations

import json
import time

import pytest

import adapters
import tests.fakemodel.server as fake_server
from tests.e2e.conftest import HARNESSES, Deployment, Harness, nonce, parse_follow
from tests.helpers import assert_one_terminal

pytestmark = [pytest.mark.conformance, pytest.mark.docker, pytest.mark.redis, pytest.mark.celery]

ASKING = [h for h in HARNESSES.values() if adapters.get(h.id).CAPABILITIES.permission_ask]
TOOL_COMMAND = "touch e2e-asked && echo asked-ran"


def _ask_and_answer(e2e: Deployment, harness: Harness, verb: str) -> tuple[str, list[dict]]:
    word = nonce()
    run = e2e.popen(
        "run",
        harness.id,
        f"[scenario:tool] run it {word}",
        *harness.args(e2e.base_url()),
        "--posture",
        "ask",
        "--follow",
        "--json",
    )
    run_id = str(json.loads(run.wait_for(lambda line: '"run_id"' in line, 60))["run_id"])
    e2e.made.append(run_id)
    run.wait_for(lambda line: '"permission-request"' in line, 120)
    pending = json.loads(e2e.cli("pending", run_id, "--json").stdout.splitlines()[0])
    answer = e2e.cli(verb, run_id, pending["request_id"], "--json")
    assert answer.returncode == 0, answer.stderr
    again = e2e.cli(verb, run_id, pending["request_id"])
    assert again.returncode == 2 and "already answered" in again.stderr
    code = run.finish()
    followed = parse_follow([line for _, line in run.timed()], code, run.stderr())
    assert_one_terminal(followed.events, 1)
    return run_id, followed.events


@pytest.mark.parametrize("harness", ASKING, ids=[h.id for h in ASKING])
def test_approved_in_the_container(
    e2e: Deployment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_server, "TOOL_COMMAND", TOOL_COMMAND)
    run_id, events = _ask_and_answer(e2e, harness, "approve")
    [decision] = [e["data"] for e in events if e["type"] == "permission-decision"]
    assert decision["decision"] == "allow"
    assert events[-1]["type"] == "turn-complete"
    code, _ = e2e.container(run_id).exec_run(["test", "-e", "/workspace/e2e-asked"])
    assert code == 0


@pytest.mark.parametrize("harness", ASKING, ids=[h.id for h in ASKING])
def test_denied_in_the_container(
    e2e: Deployment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_server, "TOOL_COMMAND", TOOL_COMMAND)
    run_id, events = _ask_and_answer(e2e, harness, "deny")
    [decision] = [e["data"] for e in events if e["type"] == "permission-decision"]
    assert decision["decision"] == "deny"
    time.sleep(0.1)
    code, _ = e2e.container(run_id).exec_run(["test", "-e", "/workspace/e2e-asked"])
    assert code != 0
