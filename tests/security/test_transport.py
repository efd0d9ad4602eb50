"""Point 4: Redis and broker URLs with passwords and TLS, and credentials never printed.

What is proven here, with a throwaway CA and server certificate made by ``openssl``:

- ``rediss://`` with a password (``requirepass``), against a real ``redis-server`` listening
  only on a TLS port: a real worker takes its records, streams *and* broker over it, and a turn
  completes; plaintext, a wrong password and an untrusted certificate are all refused.
- ``amqps://``: a real worker and the client reach the real RabbitMQ through a TLS terminator
  (an in-test TLS server forwarding to RabbitMQ's plain port); a turn completes. The client
  side of amqps (kombu/py-amqp doing TLS, verifying our CA given by ``SSL_CERT_FILE``) is
  proven; RabbitMQ's own TLS listener configuration is not.
- Credentials in URLs: the worker's log (its banner and its connection retries), ``harness
  doctor`` and the CLI's errors never show a password; ``mask_url`` masks every form.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from config import load_settings
from tests.conftest import RABBITMQ_URL, ROOT, _rabbit_up, demo_executable, require
from tests.integration.conftest import Env, make_env
from tests.security.conftest import find_leaks, start_scoped_worker
from worker.cli.doctor import mask_url
from worker.store.redis_client import redis_client

DEMO = demo_executable()

pytestmark = [pytest.mark.redis]

# A password with characters that must be URL-encoded, so masking is tested on the encoded form.
PASSWORD = "pw@:/%" + secrets.token_hex(12)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path
    """A CA that did not sign the server's certificate."""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    for name in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN=harness {name}",
            cwd=d,
        )  # fmt: skip
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext", cwd=d,
    )  # fmt: skip
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "other-ca.crt")


@dataclass
class TlsRedis:
    port: int
    pki: Pki

    def url(
        self, *, password: str = PASSWORD, ca: Path | None = None, scheme: str = "rediss"
    ) -> str:
        query = (
            f"?ssl_cert_reqs=required&ssl_ca_certs={ca or self.pki.ca}"
            if scheme == "rediss"
            else ""
        )
        return f"{scheme}://:{quote(password, safe='')}@127.0.0.1:{self.port}/0{query}"


@pytest.fixture(scope="module")
def tls_redis(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A redis-server that speaks only TLS and wants a password."""
    port = free_port()
    workdir = tmp_path_factory.mktemp("tls-redis")
    proc = subprocess.Popen(
        [
            "redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(pki.cert), "--tls-key-file", str(pki.key),
            "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "no",
            "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(workdir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = TlsRedis(port, pki)
    client = redis.Redis.from_url(server.url(), socket_connect_timeout=1)
    try:
        for _ in range(100):
            if proc.poll() is not None:
                output = proc.stdout.read().decode() if proc.stdout else ""
                require(False, f"redis-server cannot serve TLS here: {output[-500:]}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        yield server
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


# -- rediss:// with a password --------------------------------------------------------------


def test_rediss_with_password_works_and_each_guard_is_real(tls_redis: TlsRedis) -> None:
    client = redis_client(load_settings(redis_url=tls_redis.url(), key_prefix="tls"))
    assert client.ping() is True
    client.close()
    # Each of these must fail, or the test above proves nothing about TLS and the password.
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(tls_redis.url(scheme="redis"), socket_connect_timeout=2).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(tls_redis.url(password="wrong-password")).ping()
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(tls_redis.url(ca=tls_redis.pki.other_ca)).ping()


def test_rediss_broker_refuses_an_untrusted_certificate(tls_redis: TlsRedis) -> None:
    from kombu.connection import Connection

    with Connection(tls_redis.url(), connect_timeout=3) as good:
        good.ensure_connection(max_retries=1)
    with (
        Connection(tls_redis.url(ca=tls_redis.pki.other_ca), connect_timeout=3) as bad,
        pytest.raises(Exception, match="certificate verify failed"),
    ):
        bad.ensure_connection(max_retries=1)


@pytest.mark.celery
def test_turn_runs_with_records_streams_and_broker_over_rediss(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    url = tls_redis.url()
    env = make_env(tmp_path, url, HARNESS_ALLOWED_EXECUTABLES=DEMO)
    worker = start_scoped_worker(env)
    try:
        client = env.client()
        run_id = client.start_run("stdio-json", "hello over TLS", executable=DEMO)
        terminal = client.wait(run_id, 1, timeout=60)
        assert terminal.type == "turn-complete", terminal.data
        assert terminal.data["text"] == "You said: hello over TLS"
        client.end(run_id)
        client.close()
    finally:
        worker.stop()
    log = worker.logs()
    assert f"rediss://:**@127.0.0.1:{tls_redis.port}/0" in log  # Celery's banner, masked
    assert find_leaks(PASSWORD, {"worker log": log}) == []


# -- amqps:// ---------------------------------------------------------------------------------


@dataclass
class Terminator:
    """TLS on ``port``, forwarded in plain to RabbitMQ's AMQP port."""

    port: int
    handshakes: int = 0
    failures: list[str] = field(default_factory=list)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def amqps(pki: Pki) -> Iterator[Terminator]:
    if not _rabbit_up(RABBITMQ_URL):
        require(False, f"RabbitMQ is not reachable at {RABBITMQ_URL}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    terminator = Terminator(listener.getsockname()[1])
    stop = threading.Event()

    def serve_one(raw: socket.socket) -> None:
        try:
            raw.settimeout(10)
            tls = context.wrap_socket(raw, server_side=True)
            tls.settimeout(None)
        except (OSError, ssl.SSLError) as exc:
            terminator.failures.append(str(exc))
            raw.close()
            return
        terminator.handshakes += 1
        upstream = socket.create_connection(("127.0.0.1", 5672))
        threading.Thread(target=_pump, args=(tls, upstream), daemon=True).start()
        _pump(upstream, tls)

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_one, args=(raw,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield terminator
    stop.set()
    listener.close()
    thread.join(5)


def _delete_queues(prefix: str, host_queue: str) -> None:
    from kombu.connection import Connection

    from adapters import HARNESS_IDS

    with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in [f"{prefix}.{h}" for h in HARNESS_IDS] + [host_queue]:
            try:
                channel.queue_delete(queue)
            except Exception:  # noqa: BLE001 -- a queue that was never declared
                channel = conn.channel()


@pytest.mark.celery
@pytest.mark.rabbitmq
def test_turn_runs_over_amqps(
    amqps: Terminator, pki: Pki, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # trust our CA (client and worker)
    broker = f"amqps://guest:guest@127.0.0.1:{amqps.port}//"
    env = make_env(tmp_path, redis_url, HARNESS_BROKER_URL=broker)
    before = amqps.handshakes
    worker = start_scoped_worker(env, extra_env={"SSL_CERT_FILE": str(pki.ca)})
    try:
        client = env.client()
        run_id = client.start_run("stdio-json", "hello over amqps", executable=DEMO)
        terminal = client.wait(run_id, 1, timeout=60)
        assert terminal.type == "turn-complete", terminal.data
        client.end(run_id)
        client.close()
    finally:
        worker.stop()
        _delete_queues(env.prefix, env.settings().host_queue)
    assert amqps.handshakes - before >= 2  # the worker and the client both came through TLS
    assert f"amqps://guest:**@127.0.0.1:{amqps.port}//" in worker.logs()


@pytest.mark.rabbitmq
def test_amqps_refuses_a_broker_certificate_it_does_not_trust(
    amqps: Terminator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.connection import Connection

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with (
        Connection(f"amqps://guest:guest@127.0.0.1:{amqps.port}//", connect_timeout=3) as conn,
        pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"),
    ):
        conn.ensure_connection(max_retries=1)


# -- credentials are never printed ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:p%40ss@host:6380/0?ssl_cert_reqs=required", "rediss://user:***@host:6380/0?ssl_cert_reqs=required"),
        ("redis://:p@ss:w@host/0", "redis://:***@host/0"),
        ("amqps://guest:s3cr3t@mq:5671//", "amqps://guest:***@mq:5671//"),
        ("sentinel://:a@h1:26379;sentinel://:b@h2:26379", "sentinel://:***@h1:26379;sentinel://:***@h2:26379"),
        ("redis://host:6379/0?password=s3cr3t&db=1", "redis://host:6379/0?password=***&db=1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://host:6379/0?x=a@b", "redis://host:6379/0?x=a@b"),
    ],
)  # fmt: skip
def test_mask_url_hides_every_form_of_password(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def _harness(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=ROOT,
    )


def _closed_port_url(scheme: str, secret: str) -> str:
    suffix = "//" if scheme.startswith("amqp") else "/0"
    return f"{scheme}://user:{quote(secret, safe='')}@127.0.0.1:{free_port()}{suffix}"


@pytest.mark.parametrize("scheme", ["redis", "rediss", "amqp", "amqps"])
def test_doctor_and_cli_errors_never_print_a_password(scheme: str, redis_url: str) -> None:
    secret = "pw-" + secrets.token_hex(12)
    broker = _closed_port_url(scheme, secret)
    redis_side = _closed_port_url("rediss" if scheme == "rediss" else "redis", secret)
    env = {
        "HARNESS_KEY_PREFIX": "tls" + uuid.uuid4().hex[:8],
        "HARNESS_BROKER_URL": broker,
        "HARNESS_REDIS_URL": redis_side,
    }
    doctor = _harness("doctor", "--json", env=env)
    status = _harness("status", "r" + "0" * 24, env=env)
    run = _harness(
        "run", "stdio-json", "hi", "--executable", "harness-demo",
        env={**env, "HARNESS_REDIS_URL": redis_url},
    )  # fmt: skip
    outputs = {
        "doctor": doctor.stdout + doctor.stderr,
        "status": status.stdout + status.stderr,
        "run": run.stdout + run.stderr,
    }
    assert doctor.returncode == 1 and "***" in outputs["doctor"]  # it did report the URLs
    assert status.returncode == 1 and "cannot reach Redis" in outputs["status"]
    assert run.returncode == 1 and "cannot reach the broker" in outputs["run"], outputs["run"]
    assert find_leaks(secret, outputs) == []
    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(f"{env['HARNESS_KEY_PREFIX']}:*"):
        r.delete(key)
    r.close()


@pytest.mark.celery
@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_worker_log_masks_the_broker_password_while_it_cannot_connect(
    scheme: str, redis_url: str, tmp_path: Path
) -> None:
    secret = "pw-" + secrets.token_hex(12)
    broker = _closed_port_url(scheme, secret)
    env: Env = make_env(tmp_path, redis_url, HARNESS_BROKER_URL=broker)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.security.scoped_app", "worker",
             "-l", "debug", "--without-mingle", "--without-gossip"],
            cwd=ROOT,
            env={**os.environ, **env.vars},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "Cannot connect" not in log.read_text(
            errors="replace"
        ):
            assert proc.poll() is None, log.read_text(errors="replace")
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    text = log.read_text(errors="replace")
    assert "Cannot connect" in text, text[-2000:]
    assert ":**@127.0.0.1" in text
    assert find_leaks(secret, {"worker log": text}) == []
