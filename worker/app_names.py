"""Task and queue names, shared by the Celery app, the tasks and the client."""

from __future__ import annotations

TASK_RUN_TURN = "harness.run_turn"
TASK_END_RUN = "harness.end_run"
TASK_REAP = "harness.reap"
TASK_REAP_HOST = "harness.reap_host"
TASK_WORKSPACE = "harness.workspace"
"""Diff, export or rewind of a run's workspace, sent to the run's host queue."""


def harness_queue(harness: str, prefix: str = "harness") -> str:
    """The queue of a harness's first turns: ``harness.claude-code`` with the default prefix
    (the key prefix doubles as the queue namespace, so deployments sharing a broker stay apart).
    """
    return f"{prefix}.{harness}"
