"""RawApi, the exec create and inspect we speak ourselves, against a small HTTP server of
ours on a unix socket: the request the daemon gets, its error statuses, and a kept
connection the server closed meanwhile (the next request goes out on a fresh one)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.base import SandboxGone
from sandbox.docker.raw_api import RawApi
from sandbox.docker.sandbox import _refused
from sandbox.docker.stream import DaemonRefused, RawEndpoint


class Daemon:
    """Answers each request with the next reply of ``replies`` (status, body); closes the
    connection after a reply when told to (``close_after``) without saying so."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.requests: list[tuple[str, str, bytes]] = []
        self.replies: list[tuple[int, object]] = []
        self.close_after = False
        self.connections = 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.decode().split("\r\n")
                method, target, _ = lines[0].split(" ")
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append((method, target, body))
                status, reply = self.replies.pop(0)
                payload = json.dumps(reply).encode()
                conn.sendall(
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                if self.close_after:
                    return

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "docker.sock")
    yield d
    d.close()


def _api(daemon: Daemon) -> RawApi:
    return RawApi(RawEndpoint(unix_path=daemon.path), lambda: "1.41", timeout=5)


def test_exec_create_sends_what_the_sdk_sends(daemon: Daemon) -> None:
    daemon.replies.append((201, {"Id": "abc123"}))
    exec_id = _api(daemon).exec_create(
        "harness-run-r1", ["sh", "-c", "true"], env={"A": "1"}, stdin=True, workdir="/"
    )
    assert exec_id == "abc123"
    method, target, body = daemon.requests[0]
    assert (method, target) == ("POST", "/v1.41/containers/harness-run-r1/exec")
    assert json.loads(body) == {
        "User": "",
        "Privileged": False,
        "Tty": False,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Cmd": ["sh", "-c", "true"],
        "Env": ["A=1"],
        "WorkingDir": "/",
    }


def test_requests_share_one_kept_connection(daemon: Daemon) -> None:
    api = _api(daemon)
    daemon.replies += [(200, {"Running": True}), (200, {"Running": False, "ExitCode": 3})]
    assert api.exec_inspect("e1")["Running"] is True
    assert api.exec_inspect("e1")["ExitCode"] == 3
    assert daemon.connections == 1
    assert [t for _, t, _ in daemon.requests] == ["/v1.41/exec/e1/json"] * 2


def test_a_connection_the_daemon_closed_is_replaced(daemon: Daemon) -> None:
    api = _api(daemon)
    daemon.close_after = True
    daemon.replies += [(200, {"Running": True}), (200, {"Running": False, "ExitCode": 0})]
    api.exec_inspect("e1")
    assert api.exec_inspect("e1")["ExitCode"] == 0  # the kept one was closed: a fresh one
    assert daemon.connections == 2


def test_an_error_status_is_the_daemons_refusal_and_a_404_means_gone(daemon: Daemon) -> None:
    daemon.replies.append((404, {"message": "No such exec instance: e9"}))
    with pytest.raises(DaemonRefused) as caught:
        _api(daemon).exec_inspect("e9")
    assert (caught.value.status, caught.value.message) == (404, "No such exec instance: e9")
    error = _refused("inspect an exec", "r1", caught.value.status, caught.value.message)
    assert isinstance(error, SandboxGone)
    assert "No such exec instance" in str(error)


def test_an_unreachable_daemon_raises_oserror(tmp_path: Path) -> None:
    api = RawApi(RawEndpoint(unix_path=str(tmp_path / "none.sock")), lambda: "1.41", 1)
    with pytest.raises(OSError):
        api.exec_inspect("e1")


def test_a_container_inspect_is_none_for_a_404_and_the_daemons_refusal_otherwise(
    daemon: Daemon,
) -> None:
    api = _api(daemon)
    daemon.replies += [
        (404, {"message": "No such container: harness-run-r1"}),
        (200, {"Id": "c1", "Name": "/harness-run-r1"}),
        (500, {"message": "boom"}),
    ]
    assert api.container_inspect("harness-run-r1") is None
    assert api.container_inspect("harness-run-r1") == {"Id": "c1", "Name": "/harness-run-r1"}
    with pytest.raises(DaemonRefused):
        api.container_inspect("harness-run-r1")
    assert {t for _, t, _ in daemon.requests} == {"/v1.41/containers/harness-run-r1/json"}


def test_a_container_list_sends_its_filters_as_the_sdk_does(daemon: Daemon) -> None:
    daemon.replies.append((200, [{"Id": "c1"}]))
    filters = {"label": ["harness.managed=true", "harness.scope=s"], "status": ["running"]}
    assert _api(daemon).containers(filters) == [{"Id": "c1"}]
    method, target, _ = daemon.requests[0]
    path, _, query = target.partition("?")
    assert (method, path) == ("GET", "/v1.41/containers/json")
    sent = dict(part.split("=", 1) for part in query.split("&"))
    assert sent["all"] == "0"
    assert json.loads(urllib.parse.unquote_plus(sent["filters"])) == filters
