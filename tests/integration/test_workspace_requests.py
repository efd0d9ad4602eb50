"""A worker answers every workspace request it refuses: one sent past the client's checks
(a turn below 0, an unknown op) gets its refusal back at once, not silence until the
reader's timeout (it once logged ``workspace.bad_request`` and replied nothing)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.conftest import DEMO, Env, WorkerProcess, start_worker
from worker.errors import Refused
from worker.fleet import hosts

pytestmark = [pytest.mark.redis, pytest.mark.celery]

TIMEOUT_S = 20.0
"""How long the reader waits for the host; a refusal comes well within a few seconds."""


@pytest.mark.parametrize(
    ("op", "values", "said"),
    [
        ("rewind", {"turn": -1}, "turn: Input should be greater than or equal to 0"),
        ("diff", {"turn": 1, "from_turn": -3}, "from_turn: Input should be greater than"),
        ("export", {"turn": -1}, "turn: Input should be greater than or equal to 0"),
        ("shred", {}, "op: String should match pattern"),
    ],
)
def test_worker_answers_a_request_it_refuses(
    env: Env, workers: list[WorkerProcess], op: str, values: dict[str, Any], said: str
) -> None:
    workers.append(start_worker(env))
    client = env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    queue = client.status(run_id)["queue"]
    assert hosts.is_host_queue(queue, client.keys)
    began = time.monotonic()
    # Past the client's own checks: straight to the run's host, as any producer could send it.
    with pytest.raises(Refused, match="invalid request: ") as caught:
        client.workspace.ask(run_id, queue, op, lambda _: None, timeout=TIMEOUT_S, **values)
    assert said in str(caught.value)
    assert time.monotonic() - began < 10
    assert "workspace.bad_request" in workers[0].logs()


def test_a_valid_request_beside_them_is_still_served(
    env: Env, workers: list[WorkerProcess]
) -> None:
    workers.append(start_worker(env))
    client = env.client()
    run_id = client.start_run("stdio-json", "@run touch made.txt", executable=DEMO)
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    with pytest.raises(Refused, match="invalid request"):
        client.workspace.ask(
            run_id, client.status(run_id)["queue"], "diff", lambda _: None, turn=-1, timeout=20
        )
    assert b"made.txt" in client.diff(run_id, turn=1)
