"""``python -m bench.relay``: the raw latency baseline. Runs the harness (a bare subprocess, or
a bare exec in a running container) and XADDs every stdout line the moment it is read, one
command per line, with nothing else in between: the least any stdout -> stream path costs.
A last entry ``end`` marks the end of the output.

    python -m bench.relay REDIS_URL KEY INPUT [--container ID] -- ARGV...
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
from collections.abc import Iterator

import redis

from sandbox.local import widen_pipe


def local_output(argv: list[str], stdin: bytes) -> Iterator[bytes]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    fd = proc.stdout.fileno()
    widen_pipe(fd)  # the worker's local sandbox widens its pipe too
    while True:
        data = os.read(fd, 256 * 1024)
        if not data:
            break
        yield data
    proc.wait()


def docker_output(container: str, argv: list[str], stdin: bytes) -> Iterator[bytes]:
    from bench.docker_raw import HOME, RawDocker
    from sandbox.docker.stream import STDOUT, frames, open_exec_stream

    raw = RawDocker()
    try:
        exec_id = raw.api.exec_create(
            container,
            argv,
            stdin=True,
            stdout=True,
            stderr=True,
            environment={"HOME": HOME},
            workdir="/workspace",
        )["Id"]
        assert raw.endpoint is not None
        sock, initial = open_exec_stream(raw.endpoint, str(raw.api.api_version), exec_id, 60)
        try:
            sock.sendall(stdin)
            sock.shutdown(socket.SHUT_WR)
            for kind, data in frames(sock, initial):
                if kind == STDOUT:
                    yield data
        finally:
            sock.close()
    finally:
        raw.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("key")
    parser.add_argument("input")
    parser.add_argument("--container")
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis_url)
    stdin = args.input.encode()
    chunks = (
        docker_output(args.container, args.argv, stdin)
        if args.container
        else local_output(args.argv, stdin)
    )
    held = b""
    for chunk in chunks:
        held += chunk
        *lines, held = held.split(b"\n")
        for line in lines:
            client.xadd(args.key, {"data": line})
    client.xadd(args.key, {"end": "1"})


if __name__ == "__main__":
    main()
