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
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import assert_one_terminal
from tests.integration.conftest import Env
from tests.security.conftest import (
    ContainerAudit,
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
        sh("echo $HARNESS_RUN_TOKEN > /workspace/run-token"),
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


@dataclass
class SecretRun:
    secret: str
    private: str
    run_id: str
    stream: str
    run_token: str | None
    places: dict[str, str]
    """Everywhere the secret must not be, but the run's record and transcript."""
    record: dict[str, str]
    """The run's record and transcript, and the Redis commands that wrote them."""


def secret_run(
    env: Env,
    audit: ContainerAudit,
    monitor: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    ends: str,
) -> SecretRun:
    """One granted turn of ``script`` in Docker, and every place the secret could be."""
    secret = "sk-grant-" + secrets.token_hex(16)  # fresh per test: dumps hold older runs too
    private = "sk-private-" + secrets.token_hex(16)
    monkeypatch.setenv("DEMO_TOKEN", secret)  # the producer has it too: it must not send it
    worker = start_scoped_worker(
        env, loglevel="debug", extra_env={"DEMO_TOKEN": secret, "WORKER_PRIVATE": private}
    )
    run_token = None
    try:
        client = env.client()
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
        token_file = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker/run" / run_id / "run-token"
        if token_file.exists():
            run_token = token_file.read_text().strip()
        client.end(run_id)
    finally:
        worker.stop()
    log = worker.logs()
    assert "turn.finished" in log  # the log covers the run
    traffic = monitor.read_text(errors="replace")
    assert run_id in traffic and "LPUSH" in traffic.upper()  # the capture saw the task message
    keys = env.keys
    record_keys = {keys.run(run_id), keys.transcript(run_id)}
    writes = [
        line
        for line in traffic.splitlines()
        if any(f'"{key}"' in line for key in record_keys)
        and any(f'"{command}"' in line.upper() for command in ("HSET", "RPUSH"))
    ]
    dump = dump_redis(env.vars["HARNESS_REDIS_URL"])
    places = {
        **live,
        "worker log": log,
        "redis traffic (MONITOR)": "\n".join(
            line for line in traffic.splitlines() if line not in writes
        ),
        **{f"redis key {k}": v for k, v in dump.items() if k not in record_keys},
    }
    record = {
        "record writes (MONITOR)": "\n".join(writes),
        **{f"redis key {k}": v for k, v in dump.items() if k in record_keys},
    }
    return SecretRun(secret, private, run_id, texts(events), run_token, places, record)


SCRIPTS = [
    pytest.param(PRINTS, "turn-complete", id="harness-prints-it"),
    pytest.param(FAILS_WITH_IT, "session-error", id="harness-fails-with-it"),
    pytest.param(ANSWERS_WITH_IT, "turn-complete", id="harness-answers-with-it"),
]


@pytest.mark.parametrize(("script", "ends"), SCRIPTS)
def test_granted_value_reaches_only_the_harness(
    docker_env: Env,
    audit: ContainerAudit,
    monitor: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    ends: str,
) -> None:
    run = secret_run(docker_env, audit, monitor, monkeypatch, script, ends)
    if script == PRINTS:
        # The value reached the harness, and everything it printed is masked.
        assert "DEMO_TOKEN=[masked]" in run.stream
        assert run.stream.count("token:[masked]") >= 2
        assert "WORKER_PRIVATE=<unset>" in run.stream
        assert "HARNESS_REDIS_URL=<unset>" in run.stream
        # The per-run credential is a secret too: the harness left it in its workspace.
        assert "HARNESS_RUN_TOKEN=[masked]" in run.stream
        assert run.run_token and len(run.run_token) >= 32
        assert find_leaks(run.run_token, {**run.places, **run.record}) == []
    else:
        assert "[masked]" in run.stream  # the value was in the harness's last words
    assert find_leaks(run.secret, run.places) == []
    assert find_leaks(run.private, {**run.places, **run.record, "stream": run.stream}) == []


@pytest.mark.parametrize(("script", "ends"), SCRIPTS[1:])
def test_run_record_and_transcript_keep_no_granted_value(
    docker_env: Env,
    audit: ContainerAudit,
    monitor: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    ends: str,
) -> None:
    run = secret_run(docker_env, audit, monitor, monkeypatch, script, ends)
    assert run.record and find_leaks(run.secret, run.record) == []


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
