"""The Docker API calls every turn makes (create an exec, inspect it) and a run's first turn
makes (find the run's container, list the warm ones), spoken by us over a keep-alive
connection per thread.

Through the Docker SDK each such call costs about a millisecond of the worker's CPU (the
``requests`` stack: sessions, adapters, urllib3's pool, header dictionaries), and a turn
makes several: in a busy worker that is CPU the harnesses could have had. ``http.client`` on
our own socket does the same request for a fraction of it. Only ``unix://`` and plain
``tcp://`` daemons are spoken to this way (:class:`~sandbox.docker.stream.RawEndpoint`); TLS
and SSH stay with the SDK.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from sandbox.docker.stream import DaemonRefused, RawEndpoint


class _Connection(http.client.HTTPConnection):
    def __init__(self, endpoint: RawEndpoint, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self._endpoint = endpoint

    def connect(self) -> None:
        self.sock = self._endpoint.connect(self.timeout if self.timeout is not None else 60.0)
        if self._endpoint.unix_path is None:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class RawApi:
    """JSON requests to one daemon. Raises :class:`DaemonRefused` for an error status and
    ``OSError`` (or ``http.client.HTTPException``) when the daemon cannot be reached; the
    Docker backend's seam turns both into the SandboxError tree."""

    def __init__(
        self, endpoint: RawEndpoint, api_version: Callable[[], str], timeout: float
    ) -> None:
        self._endpoint = endpoint
        self._api_version = api_version
        self._timeout = timeout
        self._local = threading.local()

    def exec_create(
        self,
        container: str,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        stdin: bool,
        workdir: str,
    ) -> str:
        """As the SDK's ``exec_create`` (no TTY, stdout and stderr attached): the exec's id."""
        body = {
            "User": "",
            "Privileged": False,
            "Tty": False,
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Cmd": argv,
            "Env": [f"{k}={v}" for k, v in env.items()] if env else None,
            "WorkingDir": workdir,
        }
        reply = self._request("POST", f"/containers/{quote(container, safe='')}/exec", body)
        return str(reply["Id"])

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        reply = self._request("GET", f"/exec/{quote(exec_id, safe='')}/json")
        assert isinstance(reply, dict)
        return reply

    def container_inspect(self, name: str) -> dict[str, Any] | None:
        """As the SDK's ``inspect_container``, by name or id; None when there is none."""
        try:
            reply = self._request("GET", f"/containers/{quote(name, safe='')}/json")
        except DaemonRefused as exc:
            if exc.status == 404:
                return None
            raise
        assert isinstance(reply, dict)
        return reply

    def containers(
        self, filters: Mapping[str, list[str]], *, include_stopped: bool = False
    ) -> list[dict[str, Any]]:
        """As the SDK's ``containers(filters=...)``: the summaries of the matching ones."""
        query = urlencode({"all": int(include_stopped), "filters": json.dumps(filters)})
        reply = self._request("GET", f"/containers/json?{query}")
        assert isinstance(reply, list)
        return reply

    def _request(self, method: str, path: str, body: object = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        url = f"/v{self._api_version()}{path}"
        connection: _Connection | None = getattr(self._local, "connection", None)
        reused = connection is not None
        while True:
            if connection is None:
                connection = self._local.connection = _Connection(self._endpoint, self._timeout)
            try:
                connection.request(method, url, payload, headers)
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                self._local.connection = connection = None
                if not reused:
                    raise
                # A kept connection the daemon closed meanwhile (idle, restarted): once more
                # on a fresh one. A repeated exec create leaves at most an exec never started.
                reused = False
                continue
            if response.will_close:
                connection.close()
                self._local.connection = None
            break
        if response.status >= 400:
            raise DaemonRefused(response.status, _message(data) or response.reason)
        return json.loads(data) if data else None


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", "")).strip()
    except (ValueError, AttributeError):
        return data.decode("utf-8", "replace").strip()
