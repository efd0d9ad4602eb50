"""The model relay: the gateway on the sandbox's own loopback, for every network mode.

Shipped into the sandbox as a file and run as the turn's command, before the harness
(``python3 RELAY PORT SOCKET HARNESS ARGV...``). It listens on ``127.0.0.1:PORT`` in the
sandbox's network namespace (under network ``none`` too: loopback is all such a sandbox has),
then forks: the child relays each connection to the gateway's socket in the run's HOME, byte
for byte both ways; the parent execs the harness, which keeps its process id (the turn's
leader, as without the relay). The child leaves when the harness is gone (its parent changes)
or when the turn's processes are killed. It holds no credential: the harness's requests carry
only stand-ins, which the gateway alone can swap.

Standard library only, Python 3.8 and later: it runs in whatever image the harness has. The
worker never imports it; it ships this file's text.
"""

import contextlib
import os
import shutil
import socket
import sys
import threading
import time

CHUNK = 65536


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def relay(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # A socket address holds at most 107 bytes: connect relative to its directory (the
        # child's working directory, set once).
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def serve(listener: socket.socket, path: str, parent: int) -> None:
    directory, name = os.path.split(path)
    os.chdir(directory or ".")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the turn's pipes: the harness's end of them must be its alone
        os.dup2(null, fd)
    threading.Thread(target=watch, args=(parent,), daemon=True).start()
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=relay, args=(client, name), daemon=True).start()


def main(argv: "list[str]") -> int:
    if len(argv) < 4:
        sys.stderr.write("usage: relay PORT SOCKET COMMAND [ARGS...]\n")
        return 2
    port, path, command = int(argv[1]), argv[2], argv[3:]
    if shutil.which(command[0]) is None:
        sys.stderr.write(f"harness-exec: {command[0]}: command not found\n")
        return 127
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
    except OSError as exc:
        sys.stderr.write(f"harness model relay: cannot listen on 127.0.0.1:{port}: {exc}\n")
        return 125
    sys.stdout.flush()
    sys.stderr.flush()
    leader = os.getpid()
    if os.fork() == 0:
        try:
            serve(listener, path, leader)
        finally:
            os._exit(0)
    listener.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"harness-exec: {command[0]}: {exc}\n")
    return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv))
