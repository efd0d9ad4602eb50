"""Point 5: the container a harness runs in, and a harness that tries to get out of it.

One real worker (Docker sandbox, demo image, network none, a strict policy) serves the whole
module. Every container its turns create is inspected the moment it is created and checked
against every rule of :func:`hardening_problems` after each test (no privileged mode, all
capabilities dropped, no-new-privileges, read-only root, non-root, memory/CPU/pids limits, no
mount but the run's workspace, no Docker socket). The harness then tries to escalate from the
inside: each attempt must fail, and each turn must still end with exactly one terminal event.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_terminal
from tests.integration.conftest import Env, WorkerProcess, make_env
from tests.security.conftest import (
    ContainerAudit,
    docker_vars,
    hardening_problems,
    py,
    sh,
    start_scoped_worker,
    turn_events,
)
from worker.client import HarnessClient, StreamEvent

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker, pytest.mark.slow]

WORKER_PRIVATE = "worker-private-value-0123456789"
SHELLISH = ("harness-demo;touch /workspace/pwned", "$(touch /workspace/pwned)")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, redis_url: str, demo_image: str) -> Iterator[Env]:
    # The operator allows two executables with shell syntax in them: they must reach no shell.
    allowed = ",".join(["harness-demo", *SHELLISH])
    e = make_env(
        tmp_path_factory.mktemp("container"),
        redis_url,
        **docker_vars(HARNESS_ALLOWED_EXECUTABLES=allowed),
    )
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def watcher(env: Env) -> Iterator[ContainerAudit]:
    audit = ContainerAudit(env.prefix)
    yield audit
    audit.finish()
    audit.remove_all()


@pytest.fixture(scope="module")
def worker(env: Env, watcher: ContainerAudit) -> Iterator[WorkerProcess]:
    process = start_scoped_worker(env, extra_env={"WORKER_PRIVATE": WORKER_PRIVATE})
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def _every_container_hardened(env: Env, watcher: ContainerAudit) -> Iterator[None]:
    """After each test: every container created so far passes every hardening rule."""
    yield
    root = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker"
    assert not watcher.vanished, f"containers gone before inspection: {watcher.vanished}"
    for ident, info in list(watcher.inspected.items()):
        problems = hardening_problems(info, root)
        assert not problems, f"container {ident[:12]} ({info.get('Name')}): {problems}"


@pytest.fixture(scope="module")
def client(env: Env, worker: WorkerProcess) -> HarnessClient:
    return env.client()


@pytest.fixture(scope="module")
def target(client: HarnessClient) -> str:
    """A run whose container the escalation tests share, one turn each."""
    run_id = client.start_run("stdio-json", "hello", executable="harness-demo")
    assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
    return run_id


def attempt(client: HarnessClient, run_id: str, script: str) -> tuple[StreamEvent, str]:
    """One turn of ``run_id``; returns its terminal and what the harness's commands printed."""
    turn = client.submit_turn(run_id, script)
    terminal = client.wait(run_id, turn, timeout=120)
    events = turn_events(client, run_id, turn)
    assert assert_one_terminal(events) == terminal
    said = "\n".join(str(e.data.get("text", "")) for e in events if e.type == "assistant-text")
    return terminal, said


def container_of(watcher: ContainerAudit, run_id: str) -> dict[str, Any]:
    found = [
        c for c in watcher.containers() if c["Config"]["Labels"].get("harness.run_id") == run_id
    ]
    assert len(found) == 1, f"run {run_id} has {len(found)} containers"
    return found[0]


def layer_changes(watcher: ContainerAudit, ident: str) -> list[str]:
    """``docker diff``: paths changed in the container's own layer, less the mount point of
    Docker's init (``/usr/sbin/docker-init`` and its parents), which Docker itself creates."""
    own = {"/usr", "/usr/sbin", "/usr/sbin/docker-init"}
    return [c["Path"] for c in watcher.client.api.diff(ident) or [] if c["Path"] not in own]


# -- what the worker asked Docker for --------------------------------------------------------


def test_producer_limits_within_policy_reach_the_container(
    client: HarnessClient, watcher: ContainerAudit, target: str
) -> None:
    run_id = client.start_run(
        "stdio-json", "hi", executable="harness-demo", memory="200m", cpus=0.5, pids=100
    )
    assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
    host = container_of(watcher, run_id)["HostConfig"]
    assert (host["Memory"], host["MemorySwap"]) == (200 << 20, 200 << 20)
    assert (host["NanoCpus"], host["PidsLimit"]) == (500_000_000, 100)
    assert host["NetworkMode"] == "none"
    # Without a request the operator's defaults apply (docker_vars: 256m, 1 CPU, 128 pids).
    default = container_of(watcher, target)["HostConfig"]
    assert (default["Memory"], default["NanoCpus"], default["PidsLimit"]) == (
        256 << 20,
        1_000_000_000,
        128,
    )
    client.end(run_id)


def test_mounts_inside_are_the_workspace_and_dockers_own_files_only(
    client: HarnessClient, target: str
) -> None:
    _, said = attempt(client, target, sh("cat /proc/mounts"))
    host_backed = {}
    for line in said.splitlines():
        source, point, _fs, options = line.split()[:4]
        if source.startswith("/dev/") and point not in ("/dev", "/dev/pts", "/dev/shm"):
            host_backed[point] = options.split(",")[0]
    assert host_backed.pop("/workspace") == "rw"
    # Docker's own per-container files and its init, read-only; nothing else of the host.
    assert host_backed == {
        "/etc/resolv.conf": "ro",
        "/etc/hostname": "ro",
        "/etc/hosts": "ro",
        "/usr/sbin/docker-init": "ro",  # Docker's own init (the sandbox asks for init=True)
    }
    assert "docker.sock" not in said and "containerd" not in said


# -- a harness trying to escalate --------------------------------------------------------------


def test_writes_outside_the_workspace_fail(
    client: HarnessClient, watcher: ContainerAudit, target: str
) -> None:
    paths = ["/etc/evil", "/usr/local/bin/harness-demo", "/evil", "/var/tmp/evil", "/root/evil"]
    script = "; ".join(
        f"(echo x > {p}) 2>/dev/null && echo wrote:{p} || echo refused:{p}" for p in paths
    )
    terminal, said = attempt(
        client, target, sh(script + "; echo ok > /workspace/ok && cat /workspace/ok")
    )
    assert terminal.type == "turn-complete"
    for path in paths:
        assert f"refused:{path}" in said and f"wrote:{path}" not in said
    assert "ok" in said.split()  # the workspace itself is writable
    container = container_of(watcher, target)
    assert layer_changes(watcher, container["Id"]) == []  # the image's files are untouched


def test_mount_and_new_namespaces_fail(client: HarnessClient, target: str) -> None:
    terminal, said = attempt(
        client,
        target,
        sh(
            "mount -t tmpfs none /tmp 2>&1; echo mount=$?; "
            "mount --bind /workspace /tmp 2>&1; echo bind=$?; "
            "unshare -Urm true 2>&1; echo unshare=$?; "
            "unshare -n true 2>&1; echo netns=$?"
        ),
    )
    assert terminal.type == "turn-complete"
    for step in ("mount", "bind", "unshare", "netns"):
        assert f"{step}=0" not in said and f"{step}=" in said


def test_no_capabilities_no_new_privileges_not_root(client: HarnessClient, target: str) -> None:
    terminal, said = attempt(
        client,
        target,
        sh(
            "echo uid=$(id -u) gid=$(id -g); "
            "grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; "
            "su -c id root </dev/null 2>&1; echo su=$?; "
            "renice -n -5 $$ 2>&1; echo renice=$?"
        ),
    )
    assert terminal.type == "turn-complete"
    fields = dict(
        line.replace(":", " ", 1).split()[:2] for line in said.splitlines() if ":" in line
    )
    assert "uid=1000 gid=1000" in said
    for cap in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert fields[cap] == "0000000000000000", said
    assert fields["NoNewPrivs"] == "1"
    assert "uid=0" not in said and "su=0" not in said and "renice=0" not in said


def test_raising_limits_fails(client: HarnessClient, target: str) -> None:
    terminal, said = attempt(
        client,
        target,
        sh(
            "ulimit -Hn $(( $(ulimit -Hn) + 1 )) 2>&1; echo nofile=$?; "
            "for f in /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max; do "
            "  [ -e $f ] && { (echo max > $f) 2>/dev/null; echo pids=$?; cat $f; }; done; "
            "for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max; do "
            "  [ -e $f ] && { (echo -1 > $f) 2>/dev/null; echo memory=$?; cat $f; }; done"
        ),
    )
    assert terminal.type == "turn-complete"
    lines = said.split()
    assert "nofile=0" not in lines and "nofile=" in said
    assert "pids=0" not in lines and "128" in lines  # the limit is still the operator's
    assert "memory=0" not in lines and str(256 << 20) in lines


def test_worker_and_host_are_invisible_through_proc(
    client: HarnessClient, target: str, worker: WorkerProcess
) -> None:
    terminal, said = attempt(
        client,
        target,
        sh(
            "grep -l -a WORKER_PRIVATE /proc/[0-9]*/environ 2>/dev/null | wc -l | sed 's/^/hits=/'; "
            "cat /proc/1/cmdline | tr '\\000' ' '; echo; "
            f"cat /proc/{worker.proc.pid}/environ 2>/dev/null | tr '\\000' '\\n' | grep -c HARNESS_ | "
            "sed 's/^/worker=/'; "
            "ls -d /proc/[0-9]* | wc -l | sed 's/^/processes=/'"
        ),
    )
    assert terminal.type == "turn-complete"
    assert "hits=0" in said
    assert "worker=0" in said
    assert WORKER_PRIVATE not in said
    processes = int(said.split("processes=")[1].split()[0])
    assert processes < 20  # its own PID namespace: the host's processes are not there


def test_network_none_reaches_nothing(client: HarnessClient, target: str) -> None:
    probe = (
        "import socket, sys\n"
        "for host in ('127.0.0.1', '172.17.0.1'):\n"
        "    try:\n"
        "        socket.create_connection((host, 6379), 2).close()\n"
        "        print('reached', host)\n"
        "    except OSError as exc:\n"
        "        print('refused', host, type(exc).__name__)\n"
    )
    terminal, said = attempt(
        client,
        target,
        sh(
            f"python3 -c \"exec(bytes.fromhex('{probe.encode().hex()}').decode())\"; "
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
        ),
    )
    assert terminal.type == "turn-complete"
    assert "reached" not in said and said.count("refused") == 2
    assert said.split()[-1] == "lo"  # the only interface


def test_fork_bomb_stops_at_the_pids_limit(client: HarnessClient, watcher: ContainerAudit) -> None:
    bomb = (
        "import os, time\n"
        "started, error = 0, 'none'\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        error = exc.strerror\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.close(1); os.close(2); time.sleep(5); os._exit(0)\n"
        "    started += 1\n"
        "print('started', started, error)\n"
    )
    run_id = client.start_run(
        "stdio-json", py(bomb), executable="harness-demo", pids=32, timeout_s=60
    )
    terminal = client.wait(run_id, 1, timeout=120)
    events = turn_events(client, run_id, 1)
    assert assert_one_terminal(events) == terminal
    assert terminal.type == "turn-complete", terminal.data
    said = " ".join(str(e.data.get("text", "")) for e in events if e.type == "assistant-text")
    assert container_of(watcher, run_id)["HostConfig"]["PidsLimit"] == 32
    words = said.split()
    started = int(words[words.index("started") + 1])
    assert 0 < started < 32, said
    assert "Resource temporarily unavailable" in said
    client.end(run_id)


def test_memory_hog_is_killed_at_the_memory_limit(
    client: HarnessClient, watcher: ContainerAudit
) -> None:
    run_id = client.start_run(
        "stdio-json",
        sh("python3 -c 'b = bytearray(512 << 20); print(\"allocated\", len(b))'; echo hog=$?"),
        executable="harness-demo",
        memory="64m",
        timeout_s=60,
    )
    terminal = client.wait(run_id, 1, timeout=120)
    events = turn_events(client, run_id, 1)
    assert assert_one_terminal(events) == terminal
    assert container_of(watcher, run_id)["HostConfig"]["Memory"] == 64 << 20
    said = "\n".join(str(e.data) for e in events)
    assert "allocated" not in said
    if terminal.type == "turn-complete":  # the hog died, the harness lived to report it
        assert "hog=137" in said
    client.end(run_id)


def test_home_symlink_does_not_make_the_worker_chown_host_paths(
    client: HarnessClient, env: Env
) -> None:
    bait = env.tmp / "host-only"
    bait.mkdir()
    os.chown(bait, 0, 0)
    run_id = client.start_run(
        "stdio-json",
        sh(f"rm -rf /workspace/.home && ln -s {bait} /workspace/.home && echo planted"),
        executable="harness-demo",
    )
    terminal = client.wait(run_id, 1, timeout=120)
    assert "planted" in str([e.data for e in turn_events(client, run_id, 1)]), terminal.data
    client.submit_turn(run_id, "second turn: the worker prepares the sandbox again")
    second = client.wait(run_id, 2, timeout=120)
    assert_one_terminal(turn_events(client, run_id, 2))
    client.end(run_id)
    owner = bait.stat()
    assert (owner.st_uid, owner.st_gid) == (0, 0), (
        f"host directory {bait} now belongs to {owner.st_uid}:{owner.st_gid}; "
        f"second turn: {second.type}"
    )


def test_reused_container_is_still_the_one_that_was_audited(
    watcher: ContainerAudit, target: str
) -> None:
    """The container the escalation turns ran in is unchanged by them (inspected again now)."""
    info = container_of(watcher, target)
    root = Path(watcher.inspected[info["Id"]]["Mounts"][0]["Source"]).parents[1]
    assert hardening_problems(info, root) == []
    assert info["State"]["Running"] is True
    assert layer_changes(watcher, info["Id"]) == []


@pytest.mark.parametrize("executable", SHELLISH)
def test_executable_with_shell_syntax_reaches_no_shell(
    client: HarnessClient, env: Env, executable: str
) -> None:
    run_id = client.start_run("stdio-json", "hi", executable=executable)
    terminal = client.wait(run_id, 1, timeout=120)
    assert assert_one_terminal(turn_events(client, run_id, 1)) == terminal
    assert terminal.type == "session-error"
    assert terminal.data["reason"] == "sandbox" and "not found" in terminal.data["error"]
    workspace = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker" / "run" / run_id
    assert workspace.is_dir() and not (workspace / "pwned").exists()
    client.end(run_id)


def test_container_labels_carry_only_checked_names(
    client: HarnessClient, watcher: ContainerAudit, env: Env, demo_image: str
) -> None:
    run_id = client.start_run("stdio-json", "hi", executable="harness-demo", workspace="sec-ws_1.a")
    assert client.wait(run_id, 1, timeout=120).type == "turn-complete"
    labels = dict(container_of(watcher, run_id)["Config"]["Labels"])
    image_labels = watcher.client.api.inspect_image(demo_image)["Config"].get("Labels") or {}
    ours = {k: v for k, v in labels.items() if k not in image_labels}
    assert set(ours) == {
        "harness.managed",
        "harness.run_id",
        "harness.scope",
        "harness.worker",
        "harness.lease_until",
        "harness.workspace_key",
    }
    assert ours["harness.run_id"] == run_id
    assert ours["harness.workspace_key"] == "sec-ws_1.a"
    assert ours["harness.scope"] == env.prefix
    for value in ours.values():
        assert re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", value), value
    client.end(run_id)
