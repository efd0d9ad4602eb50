"""The run's MCP endpoint is made in the harness's HOME by a worker that runs as root: a link
the harness plants there (``.home`` itself, ``.home/.harness-endpoint``, the bridge or the
socket in it), before a turn or while one runs, never leads the worker to a host path.

Each case plants links to a host directory of root's (0700, with root's 0600 files in it)
and finds that directory exactly as it was afterwards: same entries, modes, owners and
contents. The unit cases call the turn's endpoint (``worker.tools.turn.serve``) directly on a
workspace laid out as a container's; the Docker cases have the harness plant each link in a
turn of a real run, through a real worker, and take another turn with the run's tools.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from adapters.events import SandboxActivity
from config import load_settings
from sandbox.base import Placement
from sandbox.local import LocalSandbox
from tests.integration.conftest import Env, WorkerProcess, make_env
from tests.security.conftest import (
    ContainerAudit,
    docker_vars,
    sh,
    start_scoped_worker,
    turn_events,
)
from worker.client import HarnessClient
from worker.deps import Shutdown, TurnDeps
from worker.observe.masking import Masker
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.store.keys import Keys, SyncRedis
from worker.store.records import RunStore
from worker.tools import turn as turn_tools
from worker.turn.execute import execute_turn

HARNESS_UID = 1000
"""The sandbox's user (the default ``HARNESS_CONTAINER_USER``): what the harness plants is
its own."""

DEMO = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(os.geteuid() != 0, reason="the worker runs as root here"),
]


# -- the host the links point at ---------------------------------------------------------------


def make_host(root: Path) -> Path:
    """A directory of root's, 0700, holding root's 0600 files under every name a followed link
    would reach: the socket's and the bridge's names, and the endpoint directory's."""
    host = root / "host-only"
    files = {
        "secret": b"host secret\n",
        "mcp.sock": b"not a socket\n",
        "mcp-bridge.py": b"# the host's own file\n",
        ".harness-endpoint/mcp.sock": b"not a socket either\n",
        ".harness-endpoint/mcp-bridge.py": b"# nor is this the bridge\n",
    }
    for name, data in files.items():
        path = host / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o600)
    for path in (host, host / ".harness-endpoint"):
        path.chmod(0o700)
    for path in (host, *host.rglob("*")):
        os.chown(path, 0, 0, follow_symlinks=False)
    return host


def state(host: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under ``host`` (itself included): mode, owner, group, and a digest of a file's
    bytes (the kind of anything else)."""
    seen: dict[str, tuple[int, int, int, str]] = {}
    for path in (host, *sorted(host.rglob("*"))):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode):
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = stat.filemode(info.st_mode)
        seen[str(path.relative_to(host))] = (info.st_mode, info.st_uid, info.st_gid, what)
    return seen


# -- the turn's endpoint, called directly -------------------------------------------------------


@dataclass
class Turn:
    deps: TurnDeps
    workspace: Path
    host: Path

    @property
    def home(self) -> Path:
        return self.workspace / ".home"

    @property
    def endpoint(self) -> Path:
        return self.home / turn_tools.DIRECTORY

    def serve(self) -> contextlib.AbstractContextManager[turn_tools.TurnTools | None]:
        options = RunOptions(harness="stdio-json", tools=("probe",))
        placement = Placement("docker", "r1", "/workspace", "/workspace/.home")
        return turn_tools.serve(self.deps, "r1", 2, options, placement, self.workspace, Masker())


@pytest.fixture
def turn(redis_url: str, tmp_path: Path) -> Iterator[Turn]:
    prefix = f"ep-links-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        sandbox="local", key_prefix=prefix, workspace_root=str(tmp_path),
        allowed_executables=("*",), exit_grace_s=1.0, kill_grace_s=0.2,
    )  # fmt: skip
    client = cast(SyncRedis, redis.Redis.from_url(redis_url, decode_responses=True))
    keys = Keys(prefix)
    local = LocalSandbox(tmp_path / "local")
    deps = TurnDeps(
        settings=settings, redis=client, keys=keys, store=RunStore(client, keys, 60),
        sandbox_for=lambda backend: local, worker_id="test-host:1",
        shutdown=Shutdown(settings.shutdown_grace_s),
    )  # fmt: skip
    workspace = tmp_path / "workspace"
    (workspace / ".home").mkdir(parents=True)
    for path in (workspace, workspace / ".home"):
        os.chown(path, HARNESS_UID, HARNESS_UID)
    yield Turn(deps, workspace, make_host(tmp_path))
    for found in local.managed():
        local.teardown(found.run_id)
    for key in cast(redis.Redis, client).scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


def as_harness(path: Path) -> Path:
    os.chown(path, HARNESS_UID, HARNESS_UID, follow_symlinks=False)
    return path


def harness_dir(path: Path) -> Path:
    """A directory the harness made (its own, as the worker finds it)."""
    path.mkdir()
    return as_harness(path)


def served(turn: Turn, tools: turn_tools.TurnTools | None) -> list[str]:
    """What is wrong with the endpoint (nothing: it is the worker's own directory, a real
    one, with the bridge and a socket the sandbox's user can connect to)."""
    problems = []
    info = turn.endpoint.lstat()
    if tools is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        problems.append(f"the endpoint is {stat.filemode(info.st_mode)} of uid {info.st_uid}")
    elif stat.S_IMODE(info.st_mode) != 0o755:
        problems.append(f"the endpoint's mode is {stat.filemode(info.st_mode)}")
    else:
        sock = (turn.endpoint / turn_tools.SOCKET).lstat()
        if not stat.S_ISSOCK(sock.st_mode) or stat.S_IMODE(sock.st_mode) != 0o666:
            problems.append(f"the socket is {stat.filemode(sock.st_mode)}")
        bridge = turn.endpoint / turn_tools.BRIDGE
        if bridge.is_symlink() or bridge.read_text() != turn_tools.BRIDGE_SOURCE:
            problems.append("the bridge is not the bridge")
        with socket.socket(socket.AF_UNIX) as probe:  # a short address: through a descriptor
            fd = os.open(turn.endpoint, os.O_PATH)
            try:
                probe.connect(f"/proc/self/fd/{fd}/{turn_tools.SOCKET}")
            finally:
                os.close(fd)
    return problems


def activity(tools: turn_tools.TurnTools) -> str:
    return "\n".join(e.description for e in tools.drain() if isinstance(e, SandboxActivity))


def test_an_endpoint_directory_linked_to_a_host_directory_is_not_followed(turn: Turn) -> None:
    before = state(turn.host)
    os.symlink(turn.host, turn.endpoint)
    as_harness(turn.endpoint)
    with turn.serve() as tools:
        problems = served(turn, tools)
    assert state(turn.host) == before
    assert problems == []
    assert tools is not None and "symbolic link" in activity(tools)


def test_a_bridge_linked_to_a_host_file_is_not_written_through(turn: Turn) -> None:
    before = state(turn.host)
    planted = harness_dir(turn.endpoint)
    os.symlink(turn.host / "secret", planted / turn_tools.BRIDGE)
    as_harness(planted / turn_tools.BRIDGE)
    with turn.serve() as tools:
        problems = served(turn, tools)
    assert state(turn.host) == before
    assert problems == []
    # The harness's own directory was moved aside, its link in it as it was (never followed).
    [aside] = [p for p in turn.home.iterdir() if p.name.startswith(f"{turn_tools.DIRECTORY}.")]
    assert os.readlink(aside / turn_tools.BRIDGE) == str(turn.host / "secret")
    assert tools is not None and f"uid {HARNESS_UID}" in activity(tools)


def test_a_socket_name_linked_to_a_host_file_is_not_followed(turn: Turn) -> None:
    before = state(turn.host)
    planted = harness_dir(turn.endpoint)
    os.symlink(turn.host / "mcp.sock", planted / turn_tools.SOCKET)
    as_harness(planted / turn_tools.SOCKET)
    with turn.serve() as tools:
        problems = served(turn, tools)
    assert state(turn.host) == before
    assert problems == []


def test_a_socket_swapped_for_a_link_right_after_its_bind_is_not_chmodded(
    turn: Turn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness wins the race between the socket's bind and the setting of its mode: the
    name it binds is a link to a host file by the time the mode is set."""
    target = turn.host / "mcp.sock"
    real = socket.socket

    class Raced(real):  # type: ignore[misc,valid-type]
        def bind(self, address: Any) -> None:
            super().bind(address)
            if isinstance(address, str) and address.endswith("/" + turn_tools.SOCKET):
                os.unlink(address)
                os.symlink(target, address)

    monkeypatch.setattr(socket, "socket", Raced)
    before = state(turn.host)
    refused = None
    try:
        with turn.serve():
            pass
    except turn_tools.EndpointRefused as exc:
        refused = exc
    assert state(turn.host) == before
    assert "no longer the socket" in str(refused)
    assert not (turn.endpoint / turn_tools.SOCKET).is_symlink(), "the link was left"


def test_a_home_linked_to_a_host_directory_refuses_the_endpoint(turn: Turn) -> None:
    before = state(turn.host)
    (turn.home).rmdir()
    os.symlink(turn.host, turn.home)
    as_harness(turn.home)
    refused = None
    try:
        with turn.serve():
            pass
    except turn_tools.EndpointRefused as exc:
        refused = exc
    assert state(turn.host) == before
    assert "its HOME (.home) is not a directory" in str(refused)


def test_a_turn_whose_home_became_a_link_is_refused_with_a_clear_error(
    turn: Turn, tmp_path: Path
) -> None:
    """Through ``execute_turn`` on the local backend, whose preparation keeps a HOME that is a
    link to a directory: the turn ends with one ``session-error`` (reason ``sandbox``) that
    says why, before its harness starts, and the host is as it was."""
    wrapper = tmp_path / "harness-demo"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO}" "$@"\n')
    wrapper.chmod(0o755)
    run_id = new_run_id()
    options = RunOptions(
        harness="stdio-json", executable=str(wrapper), sandbox="local", tools=("probe",)
    )
    turn.deps.store.create(run_id, options, queue="q", sandbox="local")
    first = execute_turn(turn.deps, TurnPayload(run_id=run_id, turn=1, input="@tools probe"))
    home = tmp_path / "local" / "run" / run_id / ".home"
    assert first == "completed" and (home / turn_tools.DIRECTORY / turn_tools.BRIDGE).exists()
    before = state(turn.host)
    home.rename(home.with_name("home-moved"))  # what the harness does in its turn
    os.symlink(turn.host, home)

    outcome = execute_turn(turn.deps, TurnPayload(run_id=run_id, turn=2, input="@tools probe"))

    assert state(turn.host) == before
    stream = turn.deps.redis.xrange(turn.deps.keys.events(run_id))
    [error] = [json.loads(f["data"]) for _, f in stream if f["type"] == "session-error"]
    assert outcome == "failed:sandbox" and error["reason"] == "sandbox", (outcome, error)
    assert "its HOME (.home) is not a directory" in error["error"]


@pytest.mark.parametrize("swapped", ["endpoint", "home"])
def test_links_planted_while_the_turn_runs_are_not_followed_at_its_end(
    turn: Turn, swapped: str
) -> None:
    """The harness replaces the endpoint's directory (or its whole HOME) with a link to the
    host while its turn runs: closing the endpoint removes its socket, and nothing on the
    host."""
    before = state(turn.host)
    with turn.serve() as tools:
        problems = served(turn, tools)
        moved = turn.workspace / "moved" if swapped == "home" else turn.home / "moved"
        where = turn.home if swapped == "home" else turn.endpoint
        where.rename(moved)
        os.symlink(turn.host, where)
        as_harness(where)
    assert state(turn.host) == before
    assert problems == []
    socket_left = (
        moved / turn_tools.DIRECTORY / turn_tools.SOCKET
        if swapped == "home"
        else moved / turn_tools.SOCKET
    )
    assert not socket_left.exists(), "the endpoint's own socket was left behind"


# -- in a real container, through a real worker --------------------------------------------------

PLANTS = {
    "endpoint": "cd /workspace/.home && mv .harness-endpoint ep-moved && ln -s {host} .harness-endpoint",
    "bridge": (
        "cd /workspace/.home && mv .harness-endpoint ep-moved && mkdir .harness-endpoint"
        " && ln -s {host}/secret .harness-endpoint/mcp-bridge.py"
    ),
    "socket": (
        "cd /workspace/.home && mv .harness-endpoint ep-moved && mkdir .harness-endpoint"
        " && ln -s {host}/mcp.sock .harness-endpoint/mcp.sock"
    ),
    "home": "cd /workspace && mv .home home-moved && ln -s {host} .home",
}


@pytest.fixture(scope="module")
def docker_world(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, demo_image: str
) -> Iterator[tuple[Env, HarnessClient]]:
    env = make_env(tmp_path_factory.mktemp("endpoint-links"), redis_url, **docker_vars())
    audit = ContainerAudit(env.prefix)
    worker: WorkerProcess = start_scoped_worker(env)
    try:
        yield env, env.client()
    finally:
        worker.stop()
        audit.finish()
        audit.remove_all()
        for client in env.clients:
            client.close()


@pytest.mark.celery
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_harness_planting_a_link_in_its_home_leaves_the_host_untouched(
    docker_world: tuple[Env, HarnessClient], plant: str
) -> None:
    env, client = docker_world
    host = make_host(env.tmp / f"bait-{plant}")
    before = state(host)
    # Once: a turn that resumes no session replays the run's earlier input, this script too.
    planting = PLANTS[plant].format(host=host)
    script = f"[ -e /workspace/once ] || {{ touch /workspace/once && {planting}; }} && echo planted"
    run_id = client.start_run("stdio-json", sh(script), executable="harness-demo", tools=["probe"])
    client.wait(run_id, 1, timeout=120)
    said = str([e.data for e in turn_events(client, run_id, 1)])
    assert "planted" in said, said
    client.submit_turn(run_id, "@tools probe")
    second = client.wait(run_id, 2, timeout=120)
    events = turn_events(client, run_id, 2)
    texts = [str(e.data.get("text")) for e in events if e.type == "assistant-text"]
    client.end(run_id)
    assert state(host) == before
    # The next turn's endpoint is made anew, and the harness reaches its tools through it.
    assert second.type == "turn-complete", second.data
    assert "tools probe: " in texts, texts
    if plant != "home":  # (a HOME that is a link is replaced as the sandbox is prepared)
        assert "was not the worker's" in str([e.data for e in events])
