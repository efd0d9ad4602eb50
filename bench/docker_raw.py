"""The raw Docker baselines: a bare exec through the SDK (as the sandbox does it: the SDK
creates the exec, our one HTTP request starts it), and ``docker run``."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Any

from sandbox.docker.stream import STDOUT, RawEndpoint, frames, open_exec_stream

HOME = "/workspace/.home"


class RawDocker:
    def __init__(self) -> None:
        import docker

        self.client: Any = docker.from_env(version="auto", timeout=60)
        self.api: Any = self.client.api
        url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.endpoint = RawEndpoint.parse(url)

    def close(self) -> None:
        self.client.close()

    def exec(
        self,
        container: str,
        argv: list[str],
        stdin: bytes | None,
        env: dict[str, str] | None = None,
    ) -> tuple[bytes, bytes]:
        """Create, start, feed stdin, read both streams to their end: (stdout, stderr)."""
        created = self.api.exec_create(
            container,
            argv,
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            tty=False,
            environment=env or {"HOME": HOME},
            workdir="/workspace",
        )
        exec_id = created["Id"]
        if self.endpoint is not None:
            sock, initial = open_exec_stream(self.endpoint, str(self.api.api_version), exec_id, 60)
        else:  # TLS or SSH daemons: the SDK's socket
            wrapped = self.api.exec_start(exec_id, socket=True)
            sock, initial = getattr(wrapped, "_sock", wrapped), b""
        out, err = bytearray(), bytearray()
        try:
            if stdin is not None:
                sock.sendall(stdin)
                sock.shutdown(socket.SHUT_WR)
            for kind, data in frames(sock, initial):
                (out if kind == STDOUT else err).extend(data)
        finally:
            sock.close()
        return bytes(out), bytes(err)

    def timed_exec(self, container: str, argv: list[str], stdin: bytes | None) -> float:
        started = time.perf_counter()
        self.exec(container, argv, stdin)
        return time.perf_counter() - started


def create_start_exec(raw: RawDocker, image: str, argv: list[str], stdin: bytes) -> float:
    """A new container kept for later turns, as bare as it gets through the SDK: create
    (network none, a keep-alive command), start, one exec of ``argv`` read to its end.
    Seconds to the exec's end; the container is removed after, untimed."""
    started = time.perf_counter()
    container = raw.client.containers.create(
        image, ["sleep", "infinity"], network_mode="none", user="1000:1000", init=True
    )
    try:
        container.start()
        raw.exec(container.id, argv, stdin)
        return time.perf_counter() - started
    finally:
        container.remove(force=True)


def docker_run(image: str, argv: list[str], stdin: bytes, network: str = "none") -> float:
    """``docker run --rm -i`` of the image (the CLI, as a user would): seconds to exit."""
    started = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "-i", "--network", network, image, *argv],
        input=stdin,
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - started
