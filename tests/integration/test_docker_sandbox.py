"""DockerSandbox against the real dockerd, with the demo image from scripts/build-images."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox.base import (
    ExecSpec,
    ImageMissing,
    Limits,
    Placement,
    RunSpec,
    SandboxGone,
    SandboxUnavailable,
    StartFailed,
)
from sandbox.docker.execs import DockerProcess
from sandbox.docker.sandbox import DockerSandbox
from tests.fakemodel.clis import HARNESSES, raw_invocation
from tests.fakemodel.server import FakeModelServer
from tests.integration import docker_fixtures

# The fixtures this module uses, by name (the integration conftest may import them as well).
docker_daemon = docker_fixtures.docker_daemon
demo_image = docker_fixtures.demo_image
docker_sandbox = docker_fixtures.docker_sandbox
docker_run = docker_fixtures.docker_run
clis_image = docker_fixtures.clis_image

MakeRun = Callable[..., tuple[Placement, RunSpec]]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    api = docker.from_env(timeout=60)
    yield api
    api.close()


def collect(process: DockerProcess, timeout: float = 30.0) -> tuple[bytes, bytes, int | None]:
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while not process.eof:
        assert time.monotonic() < deadline, f"no end of stream within {timeout}s"
        chunk = process.read(0.5)
        if chunk is not None:
            (out if chunk.stream == "stdout" else err).extend(chunk.data)
    return bytes(out), bytes(err), process.wait(5)


def run(
    sandbox: DockerSandbox,
    placement: Placement,
    *argv: str,
    stdin: bytes | None = None,
    secrets: dict[str, str] | None = None,
    **fields: Any,
) -> tuple[bytes, bytes, int | None]:
    process = sandbox.start(placement, ExecSpec(argv=argv, stdin=stdin, **fields), secrets or {})
    try:
        return collect(process)
    finally:
        process.kill()


def read_until(process: DockerProcess, wanted: bytes, timeout: float = 30.0) -> bytes:
    seen = bytearray()
    deadline = time.monotonic() + timeout
    while wanted not in seen and time.monotonic() < deadline and not process.eof:
        chunk = process.read(0.5)
        if chunk is not None and chunk.stream == "stdout":
            seen += chunk.data
    return bytes(seen)


def container_ps(client: Any, placement: Placement) -> str:
    container = client.containers.get(placement.container_id)
    return container.exec_run(["ps", "-eo", "pid,stat,args"]).output.decode()


@pytest.mark.docker
def test_prepare_is_idempotent_and_teardown_removes_container_and_workspace(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, spec = docker_run()
    again = docker_sandbox.prepare(spec)

    assert again == placement
    assert placement.backend == "docker"
    assert (placement.workspace, placement.home) == ("/workspace", "/workspace/.home")
    info = client.api.inspect_container(placement.container_id)
    assert info["Name"] == f"/harness-run-{spec.run_id}"
    assert info["State"]["Running"] is True
    labels = info["Config"]["Labels"]
    assert labels["harness.managed"] == "true"
    assert labels["harness.run_id"] == spec.run_id
    assert labels["harness.worker"] == "test-worker"
    workspace = docker_sandbox.root / "run" / spec.run_id
    assert workspace.is_dir()

    docker_sandbox.teardown(spec.run_id)
    docker_sandbox.teardown(spec.run_id)

    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(placement.container_id)
    assert not workspace.exists()
    assert spec.run_id not in [m.run_id for m in docker_sandbox.managed()]


@pytest.mark.docker
def test_a_stopped_container_of_the_run_is_restarted_for_its_next_turn(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, spec = docker_run()
    client.api.kill(placement.container_id)

    again = docker_sandbox.prepare(spec)

    assert again.container_id == placement.container_id
    assert run(docker_sandbox, again, "true")[2] == 0
    assert client.api.inspect_container(placement.container_id)["State"]["Running"] is True


@pytest.mark.docker
def test_a_run_whose_container_was_removed_between_turns_gets_a_new_one_at_its_next_turn(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, spec = docker_run()
    client.api.remove_container(placement.container_id, force=True)

    remembered = docker_sandbox.prepare(spec)  # from memory: no lookup before each turn
    assert remembered == placement
    assert run(docker_sandbox, remembered, "echo", "here")[::2] == (b"here\n", 0)

    fresh = docker_sandbox.prepare(spec)
    assert fresh.container_id != placement.container_id
    assert client.api.inspect_container(fresh.container_id)["State"]["Running"] is True
    assert run(docker_sandbox, fresh, "true")[2] == 0


@pytest.mark.docker
def test_teardown_keeps_the_workspace_when_asked(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, spec = docker_run()
    run(docker_sandbox, placement, "sh", "-c", "echo kept > /workspace/note")

    docker_sandbox.teardown(spec.run_id, keep_workspace=True)

    assert (docker_sandbox.root / "run" / spec.run_id / "note").read_text() == "kept\n"


@pytest.mark.docker
def test_durable_workspace_outlives_its_run(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    key = f"k{uuid.uuid4().hex[:8]}"
    first, first_spec = docker_run(workspace_key=key)
    run(docker_sandbox, first, "sh", "-c", "echo remembered > $HOME/memory")
    docker_sandbox.teardown(first_spec.run_id)

    second, _ = docker_run(workspace_key=key)
    out, _, code = run(docker_sandbox, second, "cat", "/workspace/.home/memory")

    assert (out, code) == (b"remembered\n", 0)


@pytest.mark.docker
def test_turns_of_a_run_share_workspace_and_home(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()
    run(docker_sandbox, placement, "sh", "-c", 'echo one > "$HOME/session"; echo w > file')

    out, _, code = run(docker_sandbox, placement, "sh", "-c", 'cat "$HOME/session" file; pwd')

    assert code == 0
    assert out == b"one\nw\n/workspace\n"


@pytest.mark.docker
def test_stdin_of_one_mebibyte_reaches_the_harness_followed_by_eof(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()
    data = os.urandom(1 << 20)
    script = (
        "import hashlib, sys; data = sys.stdin.buffer.read(); "
        "print(len(data), hashlib.sha256(data).hexdigest())"
    )

    out, _, code = run(docker_sandbox, placement, "python3", "-c", script, stdin=data)

    assert code == 0
    assert out.decode().split() == [str(len(data)), hashlib.sha256(data).hexdigest()]


@pytest.mark.docker
def test_no_stdin_means_the_harness_reads_eof_at_once(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()

    out, _, code = run(docker_sandbox, placement, "wc", "-c")

    assert (out.strip(), code) == (b"0", 0)


@pytest.mark.docker
def test_stdout_and_stderr_arrive_separated_with_the_exit_code(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()
    script = (
        "import sys\n"
        "for i in range(200):\n"
        "    print(f'out {i}', flush=True)\n"
        "    print(f'err {i}', file=sys.stderr, flush=True)\n"
        "sys.exit(7)\n"
    )

    out, err, code = run(docker_sandbox, placement, "python3", "-c", script)

    assert out.decode().splitlines() == [f"out {i}" for i in range(200)]
    assert err.decode().splitlines() == [f"err {i}" for i in range(200)]
    assert code == 7


@pytest.mark.docker
def test_a_quiet_turn_is_not_cut_by_the_api_timeout(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()
    impatient = DockerSandbox(docker_sandbox.root, api_timeout=1.0, scope=docker_sandbox.scope)

    out, _, code = run(impatient, placement, "sh", "-c", "sleep 2.5; echo late")

    assert (out, code) == (b"late\n", 0)


@pytest.mark.docker
def test_files_are_written_in_the_workspace_as_the_harness_user(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()
    files = {"/workspace/.home/.config/tool/config.json": '{"a": 1}', "/workspace/x.txt": "x"}

    out, _, code = run(
        docker_sandbox,
        placement,
        "sh",
        "-c",
        "stat -c '%u %n' .home/.config/tool/config.json x.txt; cat x.txt",
        files=files,
    )

    assert code == 0
    assert out.decode().splitlines() == [
        "1000 .home/.config/tool/config.json",
        "1000 x.txt",
        "x",
    ]


@pytest.mark.docker
@pytest.mark.parametrize(
    "path", ["/etc/passwd", "relative.txt", "/workspace/../etc/x", "/workspacex/y"]
)
def test_files_outside_the_workspace_are_refused(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, path: str
) -> None:
    placement, _ = docker_run()

    with pytest.raises(StartFailed, match="refusing to write"):
        docker_sandbox.start(placement, ExecSpec(argv=("true",), files={path: "x"}), {})


@pytest.mark.docker
def test_a_missing_executable_raises_start_failed(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()

    with pytest.raises(StartFailed, match="no-such-harness: command not found"):
        docker_sandbox.start(placement, ExecSpec(argv=("no-such-harness", "--json")), {})


@pytest.mark.docker
def test_a_missing_working_directory_raises_start_failed(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()

    with pytest.raises(StartFailed, match="cannot enter the working directory"):
        docker_sandbox.start(placement, ExecSpec(argv=("true",), cwd="/workspace/nope"), {})


STUBBORN = r"""
import os, signal, subprocess, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by every child below
for i in range(2):
    if os.fork() == 0:
        if i == 1:
            os.setsid()  # a child in a session of its own
        time.sleep(3600)
        os._exit(0)
# A grandchild that leaves the session AND drops the environment, holding our stdout.
subprocess.Popen(["sleep", "3601"], start_new_session=True, env={"PATH": "/usr/bin:/bin"})
print("ready", flush=True)
time.sleep(3600)
"""


@pytest.mark.docker
def test_kill_stops_the_harness_and_its_children_inside_the_container(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, _ = docker_run()
    process = docker_sandbox.start(placement, ExecSpec(argv=("python3", "-c", STUBBORN)), {})
    assert read_until(process, b"ready\n") == b"ready\n"
    before = container_ps(client, placement)
    assert before.count("python3 -c") == 3 and "sleep 3601" in before

    started = time.monotonic()
    process.kill(grace=1.0)
    elapsed = time.monotonic() - started

    after = container_ps(client, placement)
    assert elapsed < 2.0
    assert "python3" not in after
    assert "sleep 3601" not in after
    assert "sleep infinity" in after  # the container itself lives on for the next turn
    assert process.wait(5) == 137
    assert collect(process, timeout=5)[2] == 137
    process.kill()  # idempotent


@pytest.mark.docker
def test_kill_after_a_normal_exit_leaves_nothing_behind(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, _ = docker_run()
    process = docker_sandbox.start(
        placement, ExecSpec(argv=("sh", "-c", "sleep 3602 >/dev/null 2>&1 & echo bye")), {}
    )
    assert collect(process)[::2] == (b"bye\n", 0)
    assert "sleep 3602" in container_ps(client, placement)

    process.kill(grace=0.2)

    assert "sleep 3602" not in container_ps(client, placement)
    assert process.wait(0) == 0


def container_top(client: Any, placement: Placement) -> str:
    """``docker top``: the container's processes as the host sees them."""
    top = client.api.top(placement.container_id)
    return "\n".join(" ".join(row) for row in top["Processes"])


@pytest.mark.docker
def test_a_turn_left_running_by_a_killed_worker_is_killed_when_the_next_turn_starts(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, spec = docker_run()
    # A harness with a child and a daemon that left its session, marker and output behind.
    turn = "setsid env -i sleep 3605 >/dev/null 2>&1 & sleep 3606 & echo up; exec sleep 3604"
    abandoned = docker_sandbox.start(placement, ExecSpec(argv=("sh", "-c", turn)), {})
    assert read_until(abandoned, b"up\n") == b"up\n"
    abandoned.close()  # its worker was SIGKILLed: the exec goes on without a reader
    assert all(f"sleep 360{n}" in container_top(client, placement) for n in (4, 5, 6))

    restarted = DockerSandbox(docker_sandbox.root, scope=docker_sandbox.scope)
    process = restarted.start(restarted.prepare(spec), ExecSpec(argv=("echo", "next")), {})

    assert collect(process)[::2] == (b"next\n", 0)
    assert process.strays == 3
    deadline = time.monotonic() + 5
    while "sleep 360" in (top := container_top(client, placement)):
        assert time.monotonic() < deadline, f"an earlier turn's process survived:\n{top}"
        time.sleep(0.1)
    assert "sleep infinity" in top  # the container itself lives on
    assert abandoned.wait(5) == 137


@pytest.mark.docker
@pytest.mark.parametrize("network", ["none", "host"])
def test_the_container_is_hardened_by_default(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any, network: str
) -> None:
    placement, spec = docker_run(network=network, limits=Limits(memory="256m", cpus=0.5, pids=128))

    info = client.api.inspect_container(placement.container_id)
    host = info["HostConfig"]

    assert info["Config"]["User"] == "1000:1000"
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is True
    assert list(host["Tmpfs"]) == ["/tmp"]
    assert "uid=1000" in host["Tmpfs"]["/tmp"] and "gid=1000" in host["Tmpfs"]["/tmp"]
    assert host["PidsLimit"] == 128
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["MemorySwap"] == 256 * 1024 * 1024
    assert host["NanoCpus"] == 500_000_000
    assert host["NetworkMode"] == network
    assert host["Init"] is True
    assert not host.get("Binds")
    assert not host.get("Devices")
    workspace = docker_sandbox.root / "run" / spec.run_id
    assert [(m["Type"], m["Source"], m["Destination"], m["RW"]) for m in info["Mounts"]] == [
        ("bind", str(workspace), "/workspace", True)
    ]
    assert "docker.sock" not in json.dumps(info)


@pytest.mark.docker
def test_the_root_is_read_only_but_workspace_and_tmp_are_writable(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run()
    script = (
        "touch /etc/x 2>/dev/null && echo etc-writable; "
        "touch /tmp/x && echo tmp; touch /workspace/x && echo workspace; id -u"
    )

    out, _, code = run(docker_sandbox, placement, "sh", "-c", script)

    assert (out, code) == (b"tmp\nworkspace\n1000\n", 0)


@pytest.mark.docker
def test_only_granted_secrets_reach_the_exec_and_never_the_container_config(
    docker_sandbox: DockerSandbox,
    docker_run: MakeRun,
    client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker_secret = f"worker-only-{uuid.uuid4().hex}"
    granted = f"granted-{uuid.uuid4().hex}"
    monkeypatch.setenv("HARNESS_TEST_WORKER_SECRET", worker_secret)
    placement, _ = docker_run()
    process = docker_sandbox.start(
        placement,
        ExecSpec(
            argv=(
                "sh",
                "-c",
                'echo "granted=${GRANTED_TOKEN-unset} worker=${HARNESS_TEST_WORKER_SECRET-unset}"',
            )
        ),
        {"GRANTED_TOKEN": granted},
    )
    out, _, code = collect(process)

    assert (out.decode(), code) == (f"granted={granted} worker=unset\n", 0)
    exposed = json.dumps(client.api.inspect_container(placement.container_id))
    exposed += json.dumps(client.api.exec_inspect(process.exec_id))
    assert granted not in exposed
    assert worker_secret not in exposed


@pytest.mark.docker
def test_network_none_has_only_loopback(docker_sandbox: DockerSandbox, docker_run: MakeRun) -> None:
    placement, _ = docker_run(network="none")

    out, _, code = run(
        docker_sandbox,
        placement,
        "python3",
        "-c",
        "import socket; print(sorted(n for _, n in socket.if_nameindex()))",
    )

    assert (out, code) == (b"['lo']\n", 0)


@pytest.mark.docker
def test_managed_lists_runs_with_worker_and_the_renewed_lease(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, spec = docker_run()
    other = DockerSandbox(docker_sandbox.root, scope=f"other-{uuid.uuid4().hex[:8]}")

    [found] = docker_sandbox.managed()
    docker_sandbox.renew(spec.run_id, 1800000000.5)
    [renewed] = docker_sandbox.managed()

    assert (found.run_id, found.worker, found.lease_until) == (
        spec.run_id,
        "test-worker",
        1700000000.0,
    )
    assert found.ident == placement.container_id
    assert renewed.lease_until == 1800000000.5
    assert other.managed() == []


@pytest.mark.docker
def test_a_harness_killed_for_memory_ends_its_turn_with_137(
    docker_sandbox: DockerSandbox, docker_run: MakeRun
) -> None:
    placement, _ = docker_run(limits=Limits(memory="64m", cpus=1.0, pids=64))

    _, _, code = run(docker_sandbox, placement, "python3", "-c", "x = b'x' * (512 * 1024 * 1024)")

    assert code == 137
    assert run(docker_sandbox, placement, "true")[2] == 0  # the container survived


@pytest.mark.docker
def test_a_container_removed_mid_turn_ends_the_turn_and_later_starts_raise_gone(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any
) -> None:
    placement, spec = docker_run()
    process = docker_sandbox.start(placement, ExecSpec(argv=("sleep", "600")), {})

    client.api.remove_container(placement.container_id, force=True)

    assert collect(process, timeout=15)[2] == 137
    with pytest.raises(SandboxGone, match="tear the run down"):
        docker_sandbox.start(placement, ExecSpec(argv=("true",)), {})
    docker_sandbox.teardown(spec.run_id)  # still fine


@pytest.mark.docker
def test_a_missing_image_raises_image_missing_and_leaves_nothing(
    docker_sandbox: DockerSandbox,
) -> None:
    spec = RunSpec(run_id=f"t{uuid.uuid4().hex[:12]}", image="harness-worker/absent:0")

    with pytest.raises(ImageMissing, match="scripts/build-images"):
        docker_sandbox.prepare(spec)

    assert not (docker_sandbox.root / "run" / spec.run_id).exists()
    assert not docker_sandbox.image_exists("harness-worker/absent:0")


@pytest.mark.docker
def test_a_container_that_cannot_start_is_removed(
    docker_sandbox: DockerSandbox, client: Any
) -> None:
    # An image without `sleep`: creation succeeds, its command dies at once (under Docker's
    # init, after the start call returned). The run's first exec is the new container's check:
    # the start fails, saying so, and the container is removed.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
    tag = f"harness-worker/test-nosleep:{uuid.uuid4().hex[:8]}"
    client.api.import_image_from_data(buffer.getvalue(), repository=tag)
    spec = RunSpec(run_id=f"t{uuid.uuid4().hex[:12]}", image=tag)
    try:
        with pytest.raises(StartFailed, match="cannot start the container"):
            placement = docker_sandbox.prepare(spec)
            docker_sandbox.start(placement, ExecSpec(argv=("true",)), {})

        assert (
            client.containers.list(all=True, filters={"name": f"harness-run-{spec.run_id}"}) == []
        )
        docker_sandbox.teardown(spec.run_id)
        assert not (docker_sandbox.root / "run" / spec.run_id).exists()
    finally:
        client.images.remove(tag, force=True)


@pytest.mark.docker
def test_a_fresh_home_is_filled_from_the_image_skeleton(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, client: Any, demo_image: str
) -> None:
    dockerfile = (
        f"FROM {demo_image}\nUSER root\n"
        "RUN mkdir -p /opt/skel/.config/tool && echo seeded > /opt/skel/.config/tool/state\n"
        "LABEL harness.home_skeleton=/opt/skel\nUSER 1000:1000\n"
    )
    tag = f"harness-worker/test-skeleton:{uuid.uuid4().hex[:8]}"
    client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="none", rm=True
    )
    try:
        placement, _ = docker_run(image=tag)
        out, _, code = run(
            docker_sandbox,
            placement,
            "sh",
            "-c",
            "cat $HOME/.config/tool/state; stat -c %u $HOME/.config",
        )
        assert (out, code) == (b"seeded\n1000\n", 0)
    finally:
        for found in docker_sandbox.managed():
            docker_sandbox.teardown(found.run_id)
        client.images.remove(tag, force=True)


def test_an_unreachable_daemon_raises_sandbox_unavailable(tmp_path: Path) -> None:
    sandbox = DockerSandbox(tmp_path, base_url=f"unix://{tmp_path}/dead.sock")

    with pytest.raises(SandboxUnavailable, match="scripts/ensure-docker") as caught:
        sandbox.ping()
    with pytest.raises(SandboxUnavailable):
        sandbox.prepare(RunSpec(run_id="r1", image="harness-worker/demo:1"))

    assert "dead.sock" in str(caught.value)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.conformance
@pytest.mark.parametrize("harness", HARNESSES)
def test_each_cli_in_the_cli_image_answers_from_a_hardened_container(
    docker_sandbox: DockerSandbox, docker_run: MakeRun, clis_image: str, harness: str
) -> None:
    # Host networking only to reach the fake model server on this host's loopback.
    placement, _ = docker_run(image=clis_image, network="host")
    with FakeModelServer("text") as fake:
        invocation = raw_invocation(
            harness, prompt="Say hello", home=placement.home, base_url=fake.url
        )
        env = {k: v for k, v in invocation.env.items() if k != "HOME"}
        process = docker_sandbox.start(
            placement,
            ExecSpec(argv=tuple(invocation.argv), env=env, files=invocation.files, stdin=b""),
            invocation.secrets,
        )
        out, err, code = collect(process, timeout=120)
        requests = fake.requests

    assert code == 0, err.decode(errors="replace")[-2000:]
    assert any(line.startswith("{") for line in out.decode(errors="replace").splitlines())
    assert requests, "the CLI never reached the fake model server"
