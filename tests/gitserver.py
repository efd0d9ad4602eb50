"""A real git server for the tests: ``git http-backend`` behind a small HTTP server on
127.0.0.1, with HTTP Basic authentication, serving the bare repositories under a directory.

Clones and pushes go through git's own smart HTTP protocol (upload-pack, receive-pack); the
server only checks the credential and relays the CGI exchange. ``requests`` records the
``Authorization`` header each request carried (for the tests that a token went where it
should and nowhere else).
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

USER = "x-access-token"


@dataclass
class GitServer:
    root: Path
    token: str | None
    port: int = 0
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Authorization header) of every request."""
    delay_s: float = 0.0
    """How long the server sits on the next ``info/refs`` request (a clone's or a push's
    first) before answering it, once: a slow clone."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def bare(self, name: str) -> Path:
        return self.root / name

    def create(self, name: str, files: dict[str, str], *, branch: str = "main") -> str:
        """A bare repository ``name`` with one commit of ``files``; returns the commit id."""
        work = self.root.parent / f"{name}.work"
        _git("init", "-q", "-b", branch, str(work))
        for path, text in files.items():
            target = work / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        _git("-C", str(work), "add", "-A")
        _git("-C", str(work), "commit", "-q", "-m", "seed")
        _git("clone", "-q", "--bare", str(work), str(self.bare(name)))
        return _git("-C", str(work), "rev-parse", "HEAD").strip()

    def log(self, name: str, branch: str) -> list[str]:
        """Subjects of ``branch``'s commits in repository ``name``, newest first."""
        out = _git("-C", str(self.bare(name)), "log", "--format=%s", branch)
        return out.splitlines()

    def show(self, name: str, rev_path: str) -> str:
        return _git("-C", str(self.bare(name)), "show", rev_path)


def _git(*args: str) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
    }
    done = subprocess.run(["git", *args], capture_output=True, text=True, env=env, timeout=60)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout


def _handler(server: GitServer) -> type[BaseHTTPRequestHandler]:
    expected = None
    if server.token is not None:
        expected = "Basic " + base64.b64encode(f"{USER}:{server.token}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            self._relay()

        def do_POST(self) -> None:
            self._relay()

        def _relay(self) -> None:
            if server.delay_s and self.path.partition("?")[0].endswith("/info/refs"):
                delay, server.delay_s = server.delay_s, 0.0
                time.sleep(delay)
            auth = self.headers.get("Authorization")
            path, _, query = self.path.partition("?")
            server.requests.append((self.command, path, auth))
            if expected is not None and auth != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else self._chunked()
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_PROJECT_ROOT": str(server.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "GIT_CONFIG_NOSYSTEM": "1",
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "REQUEST_METHOD": self.command,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_ADDR": "127.0.0.1",
                "REMOTE_USER": USER,  # enables receive-pack (pushes)
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            }
            done = subprocess.run(
                ["git", "http-backend"], input=body, capture_output=True, env=env, timeout=60
            )
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            status, headers = 200, []
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.strip().split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _chunked(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return b""
            data = bytearray()
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()

    return Handler


@contextmanager
def git_server(root: Path, token: str | None = None) -> Iterator[GitServer]:
    """A git smart-HTTP server on 127.0.0.1 serving bare repositories under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    server = GitServer(root, token)
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.port = http.server_address[1]
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        http.shutdown()
        http.server_close()
