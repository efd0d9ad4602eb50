"""End to end: the ``harness`` command → Celery → a real worker → Docker → the real CLI → Redis.

One deployment per pytest process (so per xdist worker): its own key prefix (and so its own
queues, run keys and container scope), its own worker process on the Docker sandbox with
network ``egress`` (its own egress network and gateway, sandbox/docker/egress.py), and its own fake
model server over HTTPS on docker0's address (172.17.0.1), named ``fake-model.test`` (pinned
by the worker's egress policy), with a certificate of a test CA that the harness image used
here trusts (``harness-worker/clis-testca:*``, built on the CLI image). The containers reach
it only through the gateway; a ``forbidden`` server next to it they may not reach at all. Tests drive ``python -m worker.cli`` as subprocesses and check what
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
from pathlib import Path
from typing import Any

import docker
import pytest

from adapters.events import EVENT_TYPES, TERMINAL_TYPES
from bench.otlp_receiver import OtlpReceiver
from sandbox.docker.gateway import remove_stale
from tests.conftest import ROOT
from tests.fakemodel import FakeModelServer, RecordedRequest
from tests.fakemodel.clis import FAKE_KEY
from tests.fakemodel.tls import TestCA, make_test_ca
from tests.integration.conftest import Env, WorkerProcess, make_env, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from worker.client import HarnessClient

CONTRACT_TYPES = frozenset(EVENT_TYPES)  # held to docs/events.md by tests/unit/test_events.py
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
    """What the `--base-url` convention appends to the server's URL: ``/v1`` for OpenAI-style APIs."""
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
MODEL_NAME = "fake-model.test"
FORBIDDEN_NAME = "forbidden.test"
TEST_HOST = "172.17.0.1"
"""docker0's address on this machine: the gateway reaches the test servers there."""
CA_DIR = "/tmp/harness-e2e-ca"


class ForbiddenServer:
    """A server no run may reach (an HTTP server on docker0's address): it counts every
    connection it accepts, so a test can show that none got through."""

    def __init__(self) -> None:
        import http.server

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def setup(self) -> None:
                server.connections += 1
                super().setup()

            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"forbidden-server-reached")

            def log_message(self, *args: Any) -> None:
                pass

        self.connections = 0
        self._httpd = http.server.ThreadingHTTPServer((TEST_HOST, 0), Handler)
        self.port = int(self._httpd.server_address[1])
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def forbidden_command(port: int) -> str:
    """A tool call that tries the forbidden server by name and by raw IP through the proxy
    (git honours the proxy variables), by raw IP directly (bash's /dev/tcp), and a DNS query
    to a resolver other than the gateway's (UDP to the forbidden host's port 53): each must
    fail at once."""
    query = "0001010000010000000000000474657374076578616d706c650000010001"
    dns = (
        "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(5);"
        f"s.connect(('{TEST_HOST}',53));s.send(bytes.fromhex('{query}'));s.recv(512)"
    )
    return (
        f"git ls-remote http://{FORBIDDEN_NAME}:{port}/r.git 2>&1 | tail -n 1; "
        f"git ls-remote http://{TEST_HOST}:{port}/r.git 2>&1 | tail -n 1; "
        f"(exec 3<>/dev/tcp/{TEST_HOST}/{port}) 2>&1 | tail -n 1; "
        f'python3 -c "{dns}" 2>&1 | tail -n 1; echo forbidden-attempts-done'
    )


def egress_subnet() -> str:
    """One egress network per pytest process (xdist worker): its own subnet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return f"172.30.{210 + index}.0/24"


@dataclass
class Deployment:
    env: Env
    worker: WorkerProcess
    fake: FakeModelServer
    client: HarnessClient
    docker: Any
    forbidden: ForbiddenServer | None = None
    made: list[str] = field(default_factory=list)
    traces: OtlpReceiver | None = None
    """Where the worker exports its spans (it traces: tests/e2e/test_tracing_e2e.py)."""

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
def test_ca() -> TestCA:
    with build_lock():  # one CA for every pytest process (the image trusting it is shared)
        return make_test_ca(Path(CA_DIR), (MODEL_NAME,))


def trusting_image(base: str, ca: TestCA) -> str:
    """``base`` plus the test CA in its trust store (system bundle, Node's and OpenSSL's
    variables), built once per CA and base image."""
    import hashlib
    import tempfile

    client = docker.from_env()
    base_id = client.images.get(base).id
    digest = hashlib.sha256(base_id.encode() + ca.ca_pem.read_bytes()).hexdigest()[:12]
    tag = f"harness-worker/clis-testca:{digest}"
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(tag)
        return tag
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "ca.pem").write_bytes(ca.ca_pem.read_bytes())
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        (Path(context) / "Dockerfile").write_text(
            f"FROM {base}\nUSER root\n"
            "COPY ca.pem /usr/local/share/ca-certificates/harness-test-ca.crt\n"
            "RUN update-ca-certificates >/dev/null\n"
            f"ENV NODE_EXTRA_CA_CERTS={bundle} SSL_CERT_FILE={bundle}\n"
            "USER 1000:1000\n"
        )
        client.images.build(path=context, tag=tag, network_mode="none", rm=True)
    return tag


@pytest.fixture(scope="session")
def deployment(
    clis_image_e2e: str,
    test_ca: TestCA,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    with build_lock():
        image = trusting_image(clis_image_e2e, test_ca)
        ensure_images(["gateway"])
    subnet = egress_subnet()
    remove_stale(docker.from_env(), subnet)  # what a killed session left
    env = make_env(
        tmp_path_factory.mktemp("e2e"),
        redis_url,
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="egress",
        HARNESS_ALLOWED_NETWORKS="none,host,egress",
        HARNESS_IMAGES=",".join(f"{h}={image}" for h in HARNESSES),
        HARNESS_EGRESS_SUBNET=subnet,
        HARNESS_EGRESS_HOSTS=f"{MODEL_NAME}={TEST_HOST},{FORBIDDEN_NAME}={TEST_HOST}",
        HARNESS_EGRESS_ALLOW_BASE_URL="true",
        # The harnesses' --base-url is the fake model, on any port (operator policy).
        HARNESS_ALLOWED_BASE_URLS=MODEL_NAME,
        HARNESS_GRANTS=GRANTS,
        HARNESS_RETENTION_S="3600",
        HARNESS_CONCURRENCY="4",
        # Work in and out (tests/e2e/test_work_in_out.py): seeds from a git server on loopback.
        HARNESS_REPO_SCHEMES="http",
        HARNESS_REPO_HOSTS="127.0.0.1",
        # The model gateway (on by default) reaches the fake model by its pinned name (the
        # HARNESS_EGRESS_HOSTS above) and trusts its test CA, as a company's own LLM proxy.
        HARNESS_MODEL_CA_FILE=str(test_ca.ca_pem),
    )
    client = docker.from_env()
    forbidden = ForbiddenServer()
    fake = FakeModelServer(host=TEST_HOST, tls=test_ca.server_context(), name=MODEL_NAME)
    with fake:
        fake.forbidden_command = forbidden_command(forbidden.port)
        traces = OtlpReceiver()
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "500"}
        worker = start_worker(env, extra_env=traced, **WORKER_SECRETS)
        deployment = Deployment(env, worker, fake, env.client(), client, forbidden, traces=traces)
        try:
            yield deployment
        finally:
            worker.stop()
            traces.close()
            forbidden.close()
            remove_gateway(client, env.prefix)
            for container in client.containers.list(
                all=True,
                filters={"label": ["harness.managed=true", f"harness.scope={env.prefix}"]},
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
            for c in env.clients:
                c.close()
            client.close()


def remove_gateway(client: Any, scope: str) -> None:
    """The deployment's egress gateway and network (sandbox/docker/egress.py names them by scope)."""
    with contextlib.suppress(docker.errors.APIError):
        client.containers.get(f"harness-egress-gateway-{scope}").remove(force=True)
    with contextlib.suppress(docker.errors.APIError):
        client.networks.get(f"harness-egress-{scope}").remove()


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
