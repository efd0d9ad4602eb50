"""Point 3: a granted value reaches the harness's environment and nothing else.

A real worker (Docker sandbox, demo image, network none) holds ``DEMO_TOKEN`` and a value it
never grants (``WORKER_PRIVATE``); the producer process holds ``DEMO_TOKEN`` too, so a client
that resolved values itself would be caught. A full run grants ``DEMO_TOKEN``; the harness
prints it on stdout and stderr. Then the secret is looked for, in every form a dump could hold
it (plain, JSON-escaped, URL-quoted, hex, base64): in every command Redis received during the
run (``MONITOR``: task messages on the broker queue, task events, stream entries, records,
pub/sub), in every key of the database after it, in the worker's log (at debug level), in
``docker inspect`` of the container and of its execs, and in every process's argv on the host.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Env
from tests.security.conftest import (
    ContainerAudit,
    assert_one_terminal,
    dump_redis,
    find_leaks,
    sh,
    start_scoped_worker,
    texts,
    turn_events,
)

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]


# The harness writes to its own stdout/stderr through /proc/$PPID (the demo harness runs
# ``@run`` commands as its children), so a secret it holds can become a protocol line.
TO_STDOUT = "/proc/$PPID/fd/1"
TO_STDERR = "/proc/$PPID/fd/2"

PRINTS = "\n".join(
    [
        "@env DEMO_TOKEN",
        "@env WORKER_PRIVATE",
        "@env HARNESS_REDIS_URL",
        sh("echo token:$DEMO_TOKEN; echo token:$DEMO_TOKEN >&2"),
        sh(f"echo stderr:$DEMO_TOKEN > {TO_STDERR}"),
        "@env HARNESS_RUN_TOKEN",
        sh("echo $HARNESS_RUN_TOKEN > /workspace/run-token.txt"),
        "@text checkpoint",
        "@sleep 3",
        "@complete done",
    ]
)
FAILS_WITH_IT = "\n".join(
    [
        "@text checkpoint",
        "@sleep 3",
        sh(f"echo stderr:$DEMO_TOKEN > {TO_STDERR}"),
        sh(f'printf \'{{"type":"error","message":"bad key %s"}}\\n\' "$DEMO_TOKEN" > {TO_STDOUT}'),
        "@exit 3",
    ]
)
ANSWERS_WITH_IT = "\n".join(
    [
        "@text checkpoint",
        "@sleep 3",
        sh(
            f'printf \'{{"type":"complete","text":"the key is %s"}}\\n\' "$DEMO_TOKEN" > {TO_STDOUT}'
        ),
        "@sleep 1",
    ]
)

RECORD_BUG = (
    "bug: worker/turn.py _close() writes the terminal's error (last_error), the final answer "
    "(transcript) and session/model fields to Redis unmasked; only stream events are masked"
)


@pytest.fixture
def monitor(docker_env: Env) -> Iterator[Path]:
    """Every command Redis receives while the test runs (redis-cli MONITOR), in a file."""
    path = docker_env.tmp / "monitor.txt"
    with path.open("wb") as out:
        proc = subprocess.Popen(
            ["redis-cli", "-u", docker_env.vars["HARNESS_REDIS_URL"], "monitor"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield path
    finally:
        proc.terminate()
        proc.wait(10)


def host_argv() -> dict[str, str]:
    """Every process's command line on this host."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[f"pid {entry.name}"] = (
                    (entry / "cmdline").read_bytes().decode("utf-8", "replace")
                )
            except OSError:
                continue
    return found


def docker_views(audit: ContainerAudit) -> dict[str, str]:
    """``docker inspect`` of every container of the scope and of each of its execs, and its logs."""
    views = {}
    for info in audit.containers():
        ident = info["Id"]
        views[f"inspect {ident[:12]}"] = json.dumps(info)
        for exec_id in info.get("ExecIDs") or []:
            try:
                views[f"exec {exec_id[:12]}"] = json.dumps(audit.client.api.exec_inspect(exec_id))
            except Exception as exc:  # noqa: BLE001 -- an exec may be gone already
                views[f"exec {exec_id[:12]}"] = str(exc)
        views[f"logs {ident[:12]}"] = audit.client.api.logs(ident).decode("utf-8", "replace")
    return views


@pytest.mark.parametrize(
    ("script", "ends"),
    [
        pytest.param(PRINTS, "turn-complete", id="harness-prints-it"),
        pytest.param(
            FAILS_WITH_IT,
            "session-error",
            id="harness-fails-with-it",
            marks=pytest.mark.xfail(strict=True, reason=RECORD_BUG),
        ),
        pytest.param(
            ANSWERS_WITH_IT,
            "turn-complete",
            id="harness-answers-with-it",
            marks=pytest.mark.xfail(strict=True, reason=RECORD_BUG),
        ),
    ],
)
def test_granted_value_reaches_only_the_harness(
    docker_env: Env,
    audit: ContainerAudit,
    monitor: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    ends: str,
) -> None:
    secret = "sk-grant-" + secrets.token_hex(16)  # fresh per test: dumps hold older runs too
    private = "sk-private-" + secrets.token_hex(16)
    monkeypatch.setenv("DEMO_TOKEN", secret)  # the producer has it too: it must not send it
    worker = start_scoped_worker(
        docker_env,
        loglevel="debug",
        extra_env={"DEMO_TOKEN": secret, "WORKER_PRIVATE": private},
    )
    try:
        client = docker_env.client()
        run_id = client.start_run(
            "stdio-json", script, executable="harness-demo", grants=["DEMO_TOKEN"]
        )
        for event in client.events(run_id, follow=True, timeout=90):
            if event.type == "assistant-text" and event.data.get("text") == "checkpoint":
                break
        else:
            pytest.fail(f"the harness never reached its checkpoint: {list(client.events(run_id))}")
        # The harness is alive and holds the secret: look at the host and at Docker now.
        live = {**host_argv(), **docker_views(audit)}
        terminal = client.wait(run_id, 1, timeout=60)
        events = turn_events(client, run_id, 1)
        assert assert_one_terminal(events) == terminal
        assert terminal.type == ends, terminal.data
        stream = texts(events)
        if script == PRINTS:
            # The value reached the harness, and everything it printed is masked.
            assert "DEMO_TOKEN=[masked]" in stream
            assert stream.count("token:[masked]") >= 2
            assert "WORKER_PRIVATE=<unset>" in stream
            assert "HARNESS_REDIS_URL=<unset>" in stream
            # The per-run credential is a secret too: the harness left it in its workspace.
            assert "HARNESS_RUN_TOKEN=[masked]" in stream
            workspace = Path(docker_env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker" / "run"
            run_token = (workspace / run_id / "run-token.txt").read_text().strip()
            assert len(run_token) >= 32
        client.end(run_id)
    finally:
        worker.stop()
    log = worker.logs()
    assert "turn.finished" in log  # the log covers the run
    traffic = monitor.read_text(errors="replace")
    assert run_id in traffic and "LPUSH" in traffic.upper()  # the capture saw the task message

    places = {
        **live,
        "worker log": log,
        "redis traffic (MONITOR)": traffic,
        **{
            f"redis key {k}": v for k, v in dump_redis(docker_env.vars["HARNESS_REDIS_URL"]).items()
        },
    }
    assert find_leaks(secret, places) == []
    if script == PRINTS:
        assert find_leaks(run_token, places) == []
    assert find_leaks(private, {**places, "stream": stream}) == []


def test_container_processes_see_only_the_turns_environment(
    docker_env: Env, audit: ContainerAudit, demo_image: str
) -> None:
    """Every variable of every process in the container: the image's own, HOME and TMPDIR,
    and what the worker sets for a turn. Nothing of the worker's environment."""
    worker = start_scoped_worker(docker_env, extra_env={"WORKER_PRIVATE": "x" * 20})
    try:
        client = docker_env.client()
        run_id = client.start_run(
            "stdio-json",
            sh("cat /proc/[0-9]*/environ | tr '\\000' '\\n' | cut -d= -f1 | sort -u"),
            executable="harness-demo",
        )
        terminal = client.wait(run_id, 1, timeout=90)
        assert terminal.type == "turn-complete", terminal.data
        listing = [
            e.data["text"] for e in turn_events(client, run_id, 1) if e.type == "assistant-text"
        ]
        client.end(run_id)
    finally:
        worker.stop()
    names = set(listing[-1].split())
    image_env = audit.client.api.inspect_image(demo_image)["Config"].get("Env") or []
    allowed = {item.partition("=")[0] for item in image_env}
    allowed |= {
        "HOSTNAME",
        "HOME",
        "TMPDIR",
        "HARNESS_TURN",
        "HARNESS_RUN_TOKEN",
        "HARNESS_EXEC_ID",
        "PWD",  # set by the shell that enters the working directory
        "OLDPWD",
    }
    assert {"HOME", "HARNESS_TURN", "PATH"} <= names  # the listing worked
    assert names - allowed == set()
