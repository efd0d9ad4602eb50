"""The same turn with RabbitMQ as the broker; idle timeout; Flower showing our tasks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.integration.conftest import DEMO, Env, WorkerProcess, start_worker

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.mark.rabbitmq
def test_turn_completes_with_rabbitmq_as_broker(
    env: Env, rabbitmq_url: str, workers: list[WorkerProcess]
) -> None:
    env.vars["HARNESS_BROKER_URL"] = rabbitmq_url
    workers.append(start_worker(env))
    client = env.client()
    run_id = client.start_run("stdio-json", "over amqp", executable=DEMO)
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.type == "turn-complete"
    assert terminal.data["text"] == "You said: over amqp"
    client.submit_turn(run_id, "again")
    assert client.wait(run_id, 2, timeout=60).type == "turn-complete"
    # Redis still holds the stream and the record; the broker only carried the task.
    assert env.redis().exists(env.keys.events(run_id))


def test_idle_timeout_ends_a_silent_turn(env: Env, workers: list[WorkerProcess]) -> None:
    workers.append(start_worker(env, HARNESS_IDLE_TIMEOUT_S="1.5"))
    client = env.client()
    started = time.monotonic()
    run_id = client.start_run("stdio-json", "@text hello\n@sleep 30", executable=DEMO)
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "timeout"
    assert "no output for 1.5s" in terminal.data["error"]
    assert time.monotonic() - started < 15


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_flower_shows_a_turn_task_by_name_and_state(env: Env, workers: list[WorkerProcess]) -> None:
    workers.append(start_worker(env))
    port = _free_port()
    flower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.app",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
        env={**os.environ, **env.vars, "FLOWER_UNAUTHENTICATED_API": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=1)
                break
            except OSError:
                time.sleep(0.3)
        time.sleep(2)  # let Flower's event receiver subscribe before the task is sent
        client = env.client()
        run_id = client.start_run("stdio-json", "seen by flower", executable=DEMO)
        client.wait(run_id, 1, timeout=60)
        found = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and found is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tasks", timeout=5) as resp:
                tasks = json.load(resp)
            for task in tasks.values():
                ours = task.get("name") == "harness.run_turn" and run_id in str(task.get("args"))
                if ours and task.get("state") == "SUCCESS":
                    found = task
            time.sleep(0.5)
        assert found is not None, "Flower never showed the turn's task as SUCCESS"
        assert found["result"] and "completed" in found["result"]
    finally:
        os.killpg(flower.pid, 15)
        flower.wait(10)


def test_line_limit_setting_drops_longer_lines(env: Env, workers: list[WorkerProcess]) -> None:
    workers.append(start_worker(env, HARNESS_MAX_LINE_BYTES="4096"))
    client = env.client()
    run_id = client.start_run("stdio-json", "@bigline 10000\n@text after", executable=DEMO)
    terminal = client.wait(run_id, 1, timeout=30)
    assert terminal.type == "turn-complete"
    texts = [e.data["text"] for e in client.events(run_id) if e.type == "assistant-text"]
    assert texts == ["after"]
