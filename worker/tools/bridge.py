"""The stdio bridge: the run's MCP endpoint as a stdio MCP server, for any harness.

Shipped into the sandbox as a file and launched by the harness as its MCP server
(``python3 BRIDGE SOCKET SERVER``). It connects to the run's endpoint socket, presents the
run's credential (``HARNESS_RUN_TOKEN`` from its environment) and the server it stands for,
then relays newline-delimited JSON-RPC both ways until either side closes. Standard library
only, Python 3.8 and later: it runs in whatever image the harness has. The worker never
imports it; it ships this file's text.
"""

import contextlib
import json
import os
import socket
import sys
import threading


def connect(path: str) -> socket.socket:
    # A socket address holds at most 107 bytes: connect relative to its directory.
    os.chdir(os.path.dirname(path) or ".")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.basename(path))
    return sock


def relay_in(sock: socket.socket) -> None:
    """The harness's messages to the endpoint; the socket's write side closed at EOF."""
    stdin = sys.stdin.buffer
    try:
        for line in iter(stdin.readline, b""):
            sock.sendall(line)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def main(argv: "list[str]") -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: bridge SOCKET SERVER\n")
        return 2
    token = os.environ.get("HARNESS_RUN_TOKEN", "")
    try:
        sock = connect(argv[1])
    except OSError as exc:
        sys.stderr.write(f"harness MCP bridge: cannot reach the run's endpoint: {exc}\n")
        return 1
    sock.sendall(json.dumps({"token": token, "server": argv[2]}).encode() + b"\n")
    incoming = sock.makefile("rb")
    answer = incoming.readline()
    try:
        accepted = json.loads(answer.decode() or "{}")
    except ValueError:
        accepted = {}
    if not accepted.get("ok"):
        why = accepted.get("error") or "the endpoint closed the connection"
        sys.stderr.write(f"harness MCP bridge: refused: {why}\n")
        return 1
    threading.Thread(target=relay_in, args=(sock,), daemon=True).start()
    out = sys.stdout.buffer
    for line in iter(incoming.readline, b""):
        out.write(line)
        out.flush()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the relay thread may be blocked in a read of stdin, holding its buffer's
    # lock, and the interpreter's shutdown would then abort ("_enter_buffered_busy").
    os._exit(code)
