"""The producer API never leaks a raw error: Redis down while iterating, a bounded wait, text
that is not UTF-8, a broker that refuses the first turn or a later one."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.private_redis import PrivateRedis
from bench.worker import IsolatedEnv, delete_keys, make_env
from config import load_settings
from tests.conftest import ROOT
from worker.cli import main as cli
from worker.errors import HarnessError, InvalidInput, TurnWaitTimeout, Unavailable
from worker.options.policy import check_input

SETTINGS = load_settings()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _add(r: redis.Redis, prefix: str, run_id: str, entry_id: str, kind: str, **data: Any) -> None:
    fields = {"type": kind, "data": json.dumps(data), "ts": time.time()}
    r.xadd(f"{prefix}:run:{run_id}:events", fields, id=entry_id)


def _record(r: redis.Redis, prefix: str, run_id: str, **fields: Any) -> None:
    base = {"run_id": run_id, "harness": "stdio-json", "status": "running", "turns": 1}
    r.hset(f"{prefix}:run:{run_id}", mapping={**base, "current_turn": 1, **fields})


RUN_ID = "r" + "0" * 23 + "1"


# -- check_input: text that is not UTF-8 ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("bad \udcff", "byte 0xff at character 4"),  # argv's surrogateescape of b"\xff"
        ("\ud800 alone", "a lone surrogate U+D800 at character 0"),
    ],
)
def test_check_input_refuses_text_that_is_not_utf8(text: str, detail: str) -> None:
    with pytest.raises(InvalidInput, match="the turn input is not valid UTF-8") as caught:
        check_input(text, SETTINGS)
    assert detail in str(caught.value)


def test_check_input_accepts_astral_characters() -> None:
    check_input("emoji \U0001f600 and é", SETTINGS)


# -- the CLI refuses it before anything is created (no Redis needed) -------------------------


def _cli(argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    sys.stdout, sys.stderr = out, err
    try:
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis and broker on a closed port: a refusal must come before either is asked."""
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    monkeypatch.setenv("HARNESS_REDIS_URL", url)
    monkeypatch.setenv("HARNESS_BROKER_URL", url)


@pytest.mark.usefixtures("unreachable")
@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (["run", "stdio-json", "bad \udcff"], b"", "the prompt is not valid UTF-8"),
        (["run", "stdio-json", "-"], b"bad \xfe", "the prompt on standard input is not valid"),
        (["run", "stdio-json", "ok", "--model", "m\udcff"], b"", "--model is not valid UTF-8"),
        (
            ["run", "stdio-json", "ok", "--system-prompt", "\udce9t\udce9"],
            b"",
            "--system-prompt is not valid UTF-8",
        ),
        (["run", "stdio-json", "ok", "--allow", "Bash(\udcff)"], b"", "--allow is not valid"),
        (["run", "stdio-json", "ok", "--deny", "x\udcff"], b"", "--deny is not valid UTF-8"),
        (["turn", RUN_ID, "\udcffbad"], b"", "the input is not valid UTF-8"),
        (["turn", RUN_ID, "-"], b"\xc3(", "the input on standard input is not valid UTF-8"),
    ],
)
def test_cli_refuses_text_that_is_not_utf8_naming_it(
    argv: list[str], stdin: bytes, message: str
) -> None:
    code, out, err = _cli([*argv, *(["--executable", "x"] if argv[0] == "run" else [])], stdin)
    assert code == 2, err
    assert out == ""
    assert err.startswith(f"harness: {message}"), err
    assert "Traceback" not in err


@pytest.mark.usefixtures("unreachable")
def test_cli_refuses_a_system_prompt_file_that_is_not_utf8(tmp_path: Path) -> None:
    prompt = tmp_path / "system.txt"
    prompt.write_bytes(b"caf\xe9")
    code, _, err = _cli(
        ["run", "stdio-json", "ok", "--executable", "x", "--system-prompt", "@" + str(prompt)]
    )
    assert code == 2
    assert "is not valid UTF-8 text (byte 0xe9 at byte 3)" in err


def test_help_documents_the_exit_statuses() -> None:
    code, out, _ = _cli(["--help"])
    assert code == 0
    for status in ("0", "1", "2", str(TurnWaitTimeout.exit_code), "130"):
        assert any(line.strip().startswith(status + " ") for line in out.splitlines()), status
    assert "--wait" in out


def test_wait_needs_follow() -> None:
    code, _, err = _cli(["run", "stdio-json", "ok", "--wait", "5"])
    assert code == 2
    assert "--wait SECONDS needs --follow" in err


def test_turn_wait_timeout_is_a_harness_error_and_a_timeout_error() -> None:
    exc = TurnWaitTimeout(RUN_ID, 1, "gave up")
    assert isinstance(exc, HarnessError) and isinstance(exc, TimeoutError)
    assert exc.exit_code == 124


# -- a real Redis that goes away --------------------------------------------------------------


@pytest.fixture
def private_env(private_redis: PrivateRedis, tmp_path: Path) -> Iterator[IsolatedEnv]:
    env = make_env(tmp_path / "env", private_redis.url)
    yield env
    env.clients.clear()  # their Redis may be down: closing is not needed


@pytest.mark.redis
def test_events_raise_unavailable_when_redis_is_down_at_the_start(
    private_redis: PrivateRedis, private_env: IsolatedEnv
) -> None:
    client = private_env.client()
    private_redis.stop()
    with pytest.raises(Unavailable, match="cannot reach Redis"):
        next(client.events(RUN_ID))
    with pytest.raises(Unavailable):
        client.status(RUN_ID)


@pytest.mark.redis
def test_events_raise_unavailable_when_redis_goes_away_while_iterating(
    private_redis: PrivateRedis, private_env: IsolatedEnv
) -> None:
    r = private_env.redis()
    _record(r, private_env.prefix, RUN_ID)
    _add(r, private_env.prefix, RUN_ID, "1-0", "turn-started", harness="stdio-json")
    client = private_env.client()
    events = client.events(RUN_ID, follow=True, block_ms=200)
    assert next(events).id == "1-0"
    private_redis.stop()
    with pytest.raises(Unavailable, match="cannot reach Redis"):
        next(events)
    follow = client.follow(RUN_ID, 1, after="1-0")
    with pytest.raises(Unavailable):
        next(follow)
    # Back again: a new iterator after the last id seen goes on with no gap, no duplicate.
    private_redis.start()
    _add(r, private_env.prefix, RUN_ID, "1-1", "turn-complete", text="ok")
    assert [e.id for e in client.follow(RUN_ID, 1, after="1-0")] == ["1-1"]


@pytest.mark.redis
def test_wait_raises_turn_wait_timeout(private_env: IsolatedEnv) -> None:
    r = private_env.redis()
    _record(r, private_env.prefix, RUN_ID)
    client = private_env.client()
    began = time.monotonic()
    with pytest.raises(TurnWaitTimeout, match=r"did not end within 0\.5s") as caught:
        client.wait(RUN_ID, 1, timeout=0.5)
    assert isinstance(caught.value, TimeoutError)
    assert time.monotonic() - began < 3


@pytest.mark.redis
def test_follow_notices_a_turn_no_worker_consumes_then_gives_up(
    private_env: IsolatedEnv,
) -> None:
    r = private_env.redis()
    queue = f"{private_env.prefix}.stdio-json"
    _record(r, private_env.prefix, RUN_ID, status="starting", queue=queue)
    client = private_env.client()
    seen: list[Any] = []
    began = time.monotonic()
    with pytest.raises(TurnWaitTimeout, match=f"no worker started turn 1 .* within 3s .*{queue}"):
        for item in client.follow(RUN_ID, 1, wait=3):
            seen.append((time.monotonic() - began, item))
    assert len(seen) == 1
    at, notice = seen[0]
    assert at < 2.5
    assert notice.as_dict()["notice"] == "waiting"
    assert notice.queue == queue and notice.bound_s is None
    assert client.status(RUN_ID)["waiting_for_worker"]["queue"] == queue


@pytest.mark.redis
def test_waiting_is_none_once_the_turn_started(private_env: IsolatedEnv) -> None:
    r = private_env.redis()
    _record(r, private_env.prefix, RUN_ID, queue=f"{private_env.prefix}.stdio-json")
    client = private_env.client()
    assert client.waiting(RUN_ID) is not None
    r.set(private_env.keys.turn_started(RUN_ID, 1), "w")
    assert client.waiting(RUN_ID) is None


@pytest.mark.redis
def test_a_later_turn_on_a_host_queue_says_the_bound(private_env: IsolatedEnv) -> None:
    r = private_env.redis()
    host_queue = f"{private_env.prefix}.host.docker.gone"
    _record(r, private_env.prefix, RUN_ID, status="idle", queue=host_queue)
    client = private_env.client()
    assert client.submit_turn(RUN_ID, "again") == 2  # sent, not failed at submit
    waiting = client.waiting(RUN_ID)
    assert waiting is not None
    assert waiting.turn == 2 and waiting.queue == host_queue
    assert waiting.bound_s == getattr(client.settings, "host_wait_s", 600.0)


# -- a broker that refuses the turn ---------------------------------------------------------------


@pytest.mark.redis
def test_broker_down_at_start_run_leaves_nothing(private_env: IsolatedEnv) -> None:
    dead = f"redis://127.0.0.1:{_closed_port()}/0"
    client = private_env.client(broker_url=dead)
    with pytest.raises(Unavailable, match=r"cannot reach the broker.*the run was not created"):
        client.start_run("stdio-json", "hello", executable="harness-demo", sandbox="local")
    r = private_env.redis()
    assert list(r.scan_iter(f"{private_env.prefix}:*")) == []


@pytest.mark.redis
def test_broker_down_at_a_later_turn_sets_the_run_idle_again(private_env: IsolatedEnv) -> None:
    r = private_env.redis()
    _record(r, private_env.prefix, RUN_ID, status="idle", queue=f"{private_env.prefix}.x")
    client = private_env.client(broker_url=f"redis://127.0.0.1:{_closed_port()}/0")
    with pytest.raises(Unavailable, match="turn 2 was not sent"):
        client.submit_turn(RUN_ID, "again")
    record = client.status(RUN_ID)
    assert record["status"] == "idle"
    assert "could not be sent" in record["last_error"]
    assert not r.exists(private_env.keys.turn_queued(RUN_ID, 2))
    # The unsent turn left no trace: its number is given back, so no wait for it hangs and
    # the next turn is turn 2, counted once against --max-turns.
    assert (record["turns"], record["current_turn"]) == (1, 1)
    assert not r.exists(private_env.keys.events(RUN_ID))
    with pytest.raises(Unavailable, match="turn 2 was not sent"):
        client.submit_turn(RUN_ID, "and again")
    assert client.status(RUN_ID)["turns"] == 1


# -- harness events --follow through an outage ----------------------------------------------------


@pytest.mark.redis
@pytest.mark.slow
def test_events_follow_rides_out_a_redis_restart(
    private_redis: PrivateRedis, private_env: IsolatedEnv
) -> None:
    r = private_env.redis()
    prefix = private_env.prefix
    _record(r, prefix, RUN_ID)
    _add(r, prefix, RUN_ID, "1-0", "turn-started", harness="stdio-json")
    _add(r, prefix, RUN_ID, "1-1", "assistant-text", text="before")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "events", RUN_ID, "--follow", "--json"],
        cwd=ROOT,
        env={**os.environ, **private_env.vars, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ids = [json.loads(proc.stdout.readline())["id"] for _ in range(2)]
        assert ids == ["1-0", "1-1"]
        private_redis.stop()
        assert "Redis is unreachable; retrying…" in proc.stderr.readline()
        time.sleep(1.5)  # deliberately: the follower keeps retrying while Redis is away
        private_redis.start()
        assert "Redis is back; resuming after 1-1" in proc.stderr.readline()
        _add(r, prefix, RUN_ID, "1-2", "assistant-text", text="after")
        _add(r, prefix, RUN_ID, "1-3", "turn-complete", text="after")
        ids = [json.loads(proc.stdout.readline())["id"] for _ in range(2)]
        assert ids == ["1-2", "1-3"]  # nothing repeated, nothing missed
    finally:
        proc.kill()
        proc.wait(10)
    delete_keys(r, prefix)
