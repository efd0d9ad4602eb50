"""End to end: the ``harness`` command → Celery → a real worker → Docker → the real CLI → Redis.

One deployment per pytest process (so per xdist worker): its own key prefix (and so its own
queues, run keys and container scope), its own worker process on the Docker sandbox with host
networking, and its own fake model server on loopback, which the containers reach because they
share the host's network. Tests drive ``python -m worker.cli`` as subprocesses and check what
they print against the Redis stream (HarnessClient), the run record, the containers and the
fake server's request log.

- ``deployment`` (session): the :class:`Deployment`; built lazily, only when an e2e test runs.
- ``e2e`` (per test): the deployment; every run a test started through it is ended after.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import pytest

from adapters.events import EVENT_TYPES, TERMINAL_TYPES
from tests.conftest import ROOT
from tests.fakemodel import FakeModelServer, RecordedRequest
from tests.fakemodel.clis import FAKE_KEY
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from worker.client import HarnessClient

CONTRACT_TYPES = frozenset(EVENT_TYPES)  # held to CONTRACT.md by tests/unit/test_events.py
TERMINALS = TERMINAL_TYPES
CLI_TIMEOUT_S = 240.0
"""Longest a single ``harness`` command may take: opencode and pi retry a 5xx for ~70 s."""


@dataclass(frozen=True)
class Harness:
    """How the e2e suite runs one vendor CLI against the fake model server."""

    id: str
    binary: str
    model: str
    key: str
    """The API-key variable granted to the turn (the worker holds a fake value)."""
    version_path: str
    """What CONTRACT.md appends to the server's URL: ``/v1`` for OpenAI-style APIs."""
    reported_model: str | None
    """The model the CLI names in its stream (None: it names none)."""
    extra_grants: tuple[str, ...] = ()
    """Grants for the error scenario (claude-code: no retries of its own)."""

    def args(self, base_url: str, *, error: bool = False) -> list[str]:
        grants = [self.key, *(self.extra_grants if error else ())]
        out = ["--model", self.model, "--base-url", base_url + self.version_path]
        for name in grants:
            out += ["--grant", name]
        return out


HARNESSES: dict[str, Harness] = {
    h.id: h
    for h in (
        # The fake server answers as the model that was asked for: CLIs that report the
        # answering model report the requested one.
        Harness(
            "claude-code",
            "claude",
            "claude-sonnet-4-5",
            "ANTHROPIC_API_KEY",
            "",
            "claude-sonnet-4-5",
            extra_grants=("CLAUDE_CODE_MAX_RETRIES",),
        ),
        Harness("codex", "codex", "gpt-5.5", "OPENAI_API_KEY", "/v1", None),
        Harness("gemini", "gemini", "gemini-2.5-flash", "GEMINI_API_KEY", "", "gemini-2.5-flash"),
        Harness("opencode", "opencode", "fake-model", "OPENAI_API_KEY", "/v1", None),
        # pi names the model it was told to use, not the one that answered: no model.
        Harness("pi", "pi", "fake-model", "OPENAI_API_KEY", "/v1", None),
    )
}

#: Exactly the names the runs grant, per harness.
GRANTS = "claude-code=ANTHROPIC_API_KEY|CLAUDE_CODE_MAX_RETRIES;codex=OPENAI_API_KEY;" + (
    "gemini=GEMINI_API_KEY;opencode=OPENAI_API_KEY;pi=OPENAI_API_KEY"
)
WORKER_SECRETS = {
    "ANTHROPIC_API_KEY": FAKE_KEY,
    "OPENAI_API_KEY": FAKE_KEY,
    "GEMINI_API_KEY": FAKE_KEY,
    "CLAUDE_CODE_MAX_RETRIES": "0",
}


# --------------------------------------------------------------------------- output
class Lines:
    """A child process's stdout, read line by line in a thread, each line with its arrival
    time (``time.time()``, the clock the worker stamps events with)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append((time.time(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def timed(self) -> list[tuple[float, str]]:
        with self._cond:
            return list(self._lines)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The first line matching ``predicate``; fails the test after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for _, line in self._lines:
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    raise AssertionError(
                        f"no such line within {timeout:g}s; got {[t for _, t in self._lines]}"
                        f"\nstderr: {self.stderr()}"
                    )
                self._cond.wait(left)

    def finish(self, timeout: float = CLI_TIMEOUT_S) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"harness command still running after {timeout:g}s") from None
        self._thread.join(10)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._thread.join(10)

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-3000:]


@dataclass
class Followed:
    """What ``harness run|turn ... --follow --json`` printed."""

    run_id: str
    turn: int
    events: list[dict[str, Any]]
    returncode: int
    stderr: str

    @property
    def terminal(self) -> dict[str, Any]:
        assert self.events and self.events[-1]["type"] in TERMINALS, self.describe()
        return self.events[-1]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e["type"] == kind]

    def describe(self) -> str:
        shown = [(e["id"], e["type"], e["data"]) for e in self.events]
        return f"exit {self.returncode}, events {shown}\nstderr: {self.stderr}"


def parse_follow(lines: list[str], returncode: int, stderr: str) -> Followed:
    assert lines, f"no output (exit {returncode}): {stderr}"
    head = json.loads(lines[0])
    events = [json.loads(line) for line in lines[1:] if line.strip()]
    return Followed(head["run_id"], head["turn"], events, returncode, stderr)


# --------------------------------------------------------------------------- deployment
@dataclass
class Deployment:
    env: Env
    worker: WorkerProcess
    fake: FakeModelServer
    client: HarnessClient
    docker: Any
    made: list[str] = field(default_factory=list)

    def cli_env(self) -> dict[str, str]:
        return {**os.environ, **self.env.vars, "PYTHONUNBUFFERED": "1"}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "worker.cli", *args]

    def cli(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            cwd=ROOT,
            env=self.cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *args: str) -> Lines:
        proc = subprocess.Popen(
            self.command(*args),
            cwd=ROOT,
            env=self.cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return Lines(proc)

    def follow(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> Followed:
        """``harness ARGS --follow --json`` to the end; the run it names is ended after the
        test (fixture ``e2e``)."""
        done = self.cli(*args, "--follow", "--json", timeout=timeout)
        followed = parse_follow(done.stdout.splitlines(), done.returncode, done.stderr)
        self.made.append(followed.run_id)
        return followed

    def run(self, harness: Harness, prompt: str, *options: str, error: bool = False) -> Followed:
        return self.follow(
            "run", harness.id, prompt, *harness.args(self.base_url(), error=error), *options
        )

    def turn(self, run_id: str, text: str) -> Followed:
        return self.follow("turn", run_id, text)

    def base_url(self) -> str:
        return self.fake.url

    def requests(self, nonce: str) -> list[RecordedRequest]:
        """The model calls of one run (every request of a run carries its nonce: in the
        prompt of a first turn, and in the conversation of every later one)."""
        return [r for r in self.fake.requests if r.kind == "turn" and nonce in r.body_text()]

    def container(self, run_id: str) -> Any:
        container_id = self.client.status(run_id)["container_id"]
        assert container_id, f"run {run_id} has no container"
        return self.docker.containers.get(container_id)

    def worker_log(self) -> str:
        return self.worker.logs()[-4000:]


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Serializes scripts/build-images across pytest processes (a rebuild must run once)."""
    with open("/tmp/harness-e2e-build-images.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def clis_image_e2e() -> str:
    require_docker()
    with build_lock():
        return ensure_images(["clis"])["clis"]


@pytest.fixture(scope="session")
def deployment(
    clis_image_e2e: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    env = make_env(
        tmp_path_factory.mktemp("e2e"),
        redis_url,
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="host",
        HARNESS_ALLOWED_NETWORKS="none,host",
        HARNESS_GRANTS=GRANTS,
        HARNESS_RETENTION_S="3600",
        HARNESS_CONCURRENCY="4",
        # Work in and out (tests/e2e/test_work_in_out.py): seeds from a git server on loopback.
        HARNESS_REPO_SCHEMES="http",
        HARNESS_REPO_HOSTS="127.0.0.1",
    )
    client = docker.from_env()
    with FakeModelServer() as fake:
        worker = start_worker(env, **WORKER_SECRETS)
        deployment = Deployment(env, worker, fake, env.client(), client)
        try:
            yield deployment
        finally:
            worker.stop()
            for container in client.containers.list(
                all=True,
                filters={"label": ["harness.managed=true", f"harness.scope={env.prefix}"]},
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
            for c in env.clients:
                c.close()
            client.close()


@pytest.fixture
def e2e(deployment: Deployment) -> Iterator[Deployment]:
    """The deployment; every run a test started through it is ended afterwards."""
    deployment.made.clear()
    yield deployment
    for run_id in deployment.made:
        with contextlib.suppress(Exception):
            deployment.client.end(run_id, timeout=60)
    deployment.made.clear()


def nonce() -> str:
    return f"WORD{uuid.uuid4().hex[:10].upper()}"
