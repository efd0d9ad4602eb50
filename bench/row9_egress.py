"""Row 9: the egress gateway (issue 16). A streamed model request over HTTPS (20 SSE events,
5 ms apart, as a model streams its answer) from a run's container, through the gateway
(network ``egress``: a CONNECT tunnel through squid) against the same request direct (a
container on Docker's default bridge), p50 and p95 of the whole request and of its first
byte; and the gateway's memory holding 64 runs' rules and 64 concurrent streamed tunnels,
over its idle size.

Its own gateway (scope ``bench-egress-*``, subnet 172.30.191.0/24), its own HTTPS server on
docker0's address with a throwaway CA (``openssl``); the client is Python in the demo image.
"""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from bench.context import DEMO_IMAGE, Bench, docker_problem
from bench.stats import mib, p50, percentile
from bench.table import Figure, RowResult

HOST = "172.17.0.1"
NAME = "model.bench.test"
SUBNET = "172.30.191.0/24"
TARGET_RATIO = 1.2
EVENTS, EVENT_GAP_S = 20, 0.005
CONCURRENT = 64

CLIENT = r"""
import json, os, socket, ssl, sys, threading, time, urllib.request
open('/tmp/ca.pem', 'w').write(os.environ['BENCH_CA'])
ctx = ssl.create_default_context(cafile='/tmp/ca.pem')
url, count, parallel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def one():
    t = time.perf_counter()
    with urllib.request.urlopen(url, context=ctx, timeout=60) as r:
        first = r.read(1)
        ttfb = time.perf_counter() - t
        r.read()
    return ttfb, time.perf_counter() - t
if parallel > 1:
    out = []
    def run():
        out.append(one())
    threads = [threading.Thread(target=run) for _ in range(parallel)]
    for th in threads: th.start()
    for th in threads: th.join()
    print(json.dumps(out))
else:
    print(json.dumps([one() for _ in range(count)]))
"""


class _Stream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        hold = float(self.path.rsplit("hold=", 1)[1]) if "hold=" in self.path else 0.0
        for i in range(EVENTS):
            data = f'data: {{"delta": "token {i}"}}\n\n'.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(hold if i == 0 and hold else EVENT_GAP_S)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=bench CA",
            "-addext", "basicConstraints=critical,CA:TRUE")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "s.key", "-out", "s.csr",
            "-subj", f"/CN={NAME}")  # fmt: skip
    (directory / "s.ext").write_text(f"subjectAltName=DNS:{NAME}\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", "s.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "s.pem", "-days", "2", "-extfile", "s.ext")  # fmt: skip
    return directory / "ca.pem", directory / "s.pem", directory / "s.key"


def _memory(container: Any) -> float:
    """The gateway's memory in bytes (the cgroup's usage less its reclaimable page cache)."""
    stats = container.stats(stream=False)["memory_stats"]
    detail = stats.get("stats", {})
    return float(stats["usage"] - detail.get("inactive_file", detail.get("cache", 0)))


def run(bench: Bench) -> RowResult:
    result = RowResult("9", "egress gateway: streamed request through it vs direct; its memory")
    problem = docker_problem(DEMO_IMAGE)
    if problem is None and shutil.which("openssl") is None:
        problem = "openssl is not installed"
    if problem is None:
        import docker

        client = docker.from_env()
        try:
            client.images.get("harness-worker/gateway:1")
        except docker.errors.ImageNotFound:
            problem = "image harness-worker/gateway:1 is missing: scripts/build-images"
    if problem is not None:
        result.skipped = problem
        return result
    import docker

    from sandbox.docker.egress import render_squid_conf
    from sandbox.docker.gateway import Gateway, remove_stale
    from sandbox.network import LABEL_BASE_URL, LABEL_HARNESS, EgressConfig, Endpoint

    repeats = {"full": 60, "quick": 30, "smoke": 5}.get(bench.profile, 30)
    parallel = CONCURRENT if bench.profile != "smoke" else 8
    scope = f"bench-egress-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-egress-"))
    ca, cert, key = _certificates(workdir)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    server = Server((HOST, 0), _Stream)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])
    config = EgressConfig(
        scope=scope,
        subnet=SUBNET,
        hosts={NAME: HOST},
        allow={"stdio-json": (Endpoint(NAME, port),)},
    )
    client = docker.from_env()
    remove_stale(client, SUBNET)  # what a killed run of this row left
    gateway = Gateway(config, lambda: client, lambda *a, **k: nullcontext())
    made: list[Any] = []

    def container(**kwargs: Any) -> Any:
        made.append(
            client.containers.run(
                DEMO_IMAGE, ["sleep", "600"], detach=True, user="1000:1000", cap_drop=["ALL"],
                environment={"BENCH_CA": ca.read_text(), **kwargs.pop("environment", {})},
                **kwargs,
            )
        )  # fmt: skip
        return made[-1]

    def measure(target: Any, url: str, count: int, width: int = 1) -> list[tuple[float, float]]:
        code, out = target.exec_run(["python3", "-c", CLIENT, url, str(count), str(width)])
        if code != 0:
            raise RuntimeError(out.decode()[-800:])
        return [tuple(pair) for pair in json.loads(out.decode().strip().splitlines()[-1])]

    try:
        gateway.ensure()
        direct = container(network="bridge", extra_hosts={NAME: HOST})
        through = container(
            network=config.network_name,
            dns=[config.router_ip],
            environment=_proxy_env(config.proxy_url),
            labels={LABEL_HARNESS: "stdio-json", LABEL_BASE_URL: ""},
        )
        gateway.sync()
        url = f"https://{NAME}:{port}/v1/stream"
        measure(direct, url, 3)
        measure(through, url, 3)  # warm both paths
        ours, base = [], []
        for _ in range(repeats // 5):  # interleaved: both see the same machine load
            base += measure(direct, url, 5)
            ours += measure(through, url, 5)
        for index, label in ((1, "streamed request"), (0, "first byte")):
            for pct, name in ((50, "p50"), (95, "p95")):
                mine = percentile([o[index] for o in ours], pct) * 1000
                theirs = percentile([b[index] for b in base], pct) * 1000
                target = f"<= {TARGET_RATIO:g}x" if index == 1 else ""
                met = mine <= TARGET_RATIO * theirs if index == 1 else None
                result.figures.append(
                    Figure(f"{label} {name} (gateway vs direct)", mine, theirs, "ms", target, met)
                )
        # 64 runs: their rules in the gateway, and one streamed request each at once.
        container_obj = client.containers.get(config.container_name)
        idle = _memory(container_obj)
        clients = {f"172.30.191.{10 + i}": (Endpoint(NAME, port),) for i in range(CONCURRENT)}
        clients[gateway.address_of(through.id) or ""] = (Endpoint(NAME, port),)
        gateway._reload(render_squid_conf(config, clients))
        peak = [idle]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak.append(_memory(container_obj))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        held = measure(through, f"{url}?hold=1.0", 1, parallel)
        stop.set()
        sampler.join(5)
        loaded = max(peak)
        result.figures.append(
            Figure(f"gateway memory, {parallel} runs streaming", mib(loaded), mib(idle), "MiB")
        )
        result.checks[f"all {parallel} concurrent streamed requests completed"] = (
            len(held) == parallel
        )
        result.notes.append(
            f"{len(ours)} requests each way; per run in the gateway: "
            f"{mib((loaded - idle) / parallel):.2f} MiB while streaming; "
            f"direct p50 {p50([b[1] for b in base]) * 1000:.1f} ms for {EVENTS} events "
            f"{EVENT_GAP_S * 1000:g} ms apart"
        )
    finally:
        for item in made:
            item.remove(force=True)
        gateway.remove()
        server.shutdown()
        server.server_close()
        shutil.rmtree(workdir, ignore_errors=True)
        client.close()
    return result


def _proxy_env(url: str) -> dict[str, str]:
    return {"HTTPS_PROXY": url, "https_proxy": url, "HTTP_PROXY": url, "http_proxy": url}
