"""Work in and out, through a real worker, real Docker and the demo harness: a run seeded
from a repository on a real git server (with the worker's credential) or from an uploaded
archive, a ``workspace`` event per turn, ``harness diff``/``export``/``rewind`` from another
process, pushes of each turn to a branch, and the refusals (nothing left behind)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.gitserver import GitServer, git_server
from tests.helpers import assert_one_terminal
from tests.integration.conftest import Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from worker.client import HarnessClient, StreamEvent
from worker.errors import InvalidInput, RunBusy

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.docker]

DEMO = "harness-demo"
TOKEN = "gittok-9f8e7d6c5b4a"
TOKEN_VAR = "TEST_GIT_TOKEN"
SEED_FILES = {"README.md": "seed line\n", "src/app.py": "print('hello')\n", "bin.dat": "x"}


@pytest.fixture(scope="module")
def demo_image() -> str:
    require_docker()
    return ensure_images(["demo"])["demo"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    with git_server(tmp_path_factory.mktemp("git") / "repos", token=TOKEN) as s:
        s.create("seed.git", SEED_FILES)
        yield s


@pytest.fixture(scope="module")
def deployment(
    shared_env: Env, demo_image: str, server: GitServer
) -> Iterator[tuple[Env, WorkerProcess]]:
    shared_env.vars.update(
        HARNESS_SANDBOX="docker",
        HARNESS_NETWORK="none",
        HARNESS_ALLOWED_EXECUTABLES=DEMO,
        HARNESS_REPO_SCHEMES="http",
        HARNESS_REPO_HOSTS="127.0.0.1",
        HARNESS_REPO_CREDENTIALS=f"127.0.0.1={TOKEN_VAR}",
        HARNESS_ARCHIVE_MAX_BYTES="1000000",
        HARNESS_EXPORT_MAX_BYTES="200000",
    )
    worker = start_worker(shared_env, extra_env={TOKEN_VAR: TOKEN})
    yield shared_env, worker
    worker.stop()
    client = docker.from_env()
    for container in client.containers.list(
        all=True, filters={"label": [f"harness.scope={shared_env.prefix}"]}
    ):
        container.remove(force=True)
    client.close()


@pytest.fixture
def client(deployment: tuple[Env, WorkerProcess]) -> Iterator[HarnessClient]:
    env, _ = deployment
    c = env.client()
    made: list[str] = []
    original = c.start_run

    def start_run(*args: Any, **kwargs: Any) -> str:
        run_id = original(*args, **kwargs)
        made.append(run_id)
        return run_id

    c.start_run = start_run  # type: ignore[method-assign]
    yield c
    for run_id in made:
        with contextlib.suppress(Exception):  # a refused run may be gone already
            c.end(run_id, timeout=30)


def script(*lines: str) -> str:
    return "\n".join(lines)


def run_cmd(command: str) -> str:
    """A demo ``@run`` of a shell command (the demo splits its arguments on whitespace, so
    the command's own spaces become ``${IFS}``: none around a redirection or ``&&``)."""
    return "@run sh -c " + command.replace(" ", "${IFS}")


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    client.wait(run_id, turn, timeout=90)
    events = [e for e in client.events(run_id) if e.turn == turn]
    assert_one_terminal([e.as_dict() for e in events], turn)
    return events


def cli(env: Env, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **env.vars},
        stdin=subprocess.DEVNULL,
    )


def workspace_event(events: list[StreamEvent]) -> dict[str, Any]:
    found = [e for e in events if e.type == "workspace"]
    assert len(found) == 1, [e.type for e in events]
    # Just before the terminal event.
    assert events[-2].type == "workspace", [e.type for e in events]
    return found[0].data


def test_seeded_repo_turns_diff_export_rewind_and_push(
    deployment: tuple[Env, WorkerProcess], client: HarnessClient, server: GitServer, tmp_path: Path
) -> None:
    env, worker = deployment
    first = script(
        "change the app, add notes",
        run_cmd("echo 'print(42)'>>src/app.py&&echo note>notes.txt&&rm bin.dat"),
        "@env " + TOKEN_VAR,
        "@complete done",
    )
    run_id = client.start_run(
        "stdio-json",
        first,
        executable=DEMO,
        repo=server.url("seed.git"),
        ref="main",
        push_branch="agent/work",
    )
    events = turn_events(client, run_id, 1)
    assert events[-1].type == "turn-complete", [e.as_dict() for e in events]
    change = workspace_event(events)
    assert change["added"] == ["notes.txt"], [e.as_dict() for e in events]
    assert change["modified"] == ["src/app.py"]
    assert change["deleted"] == ["bin.dat"]
    assert change["lines_added"] == 2 and change["lines_removed"] == 1  # bin.dat: "x"
    assert change["pushed_branch"] == "agent/work" and change["snapshot"]
    record = client.status(run_id)
    assert record["seed"].startswith(f"{server.url('seed.git')}@main (commit ")
    assert record["snapshot"] == change["snapshot"]

    # The git credential was the worker's alone: not in the sandbox, the stream, the record.
    assert all(TOKEN not in json.dumps(e.data) for e in events)
    assert TOKEN not in json.dumps(record)
    assert TOKEN not in worker.logs()
    container = docker.from_env().containers.get(record["container_id"])
    _, out = container.exec_run(["sh", "-c", "cat /workspace/.git/config; env"])
    assert TOKEN not in out.decode() and "extraheader" not in out.decode().lower()
    # The push went to the seed repository, on top of its history, message: the input's
    # first line; every request to the server carried the worker's credential.
    assert server.log("seed.git", "agent/work") == [
        "change the app, add notes",
        f"seed: {server.url('seed.git')} at main",
        "seed",
    ]
    assert all(auth is not None for _, _, auth in server.requests)

    # diff, export, rewind from another process, as any producer host would.
    diff = cli(env, "diff", run_id, "--turn", "1")
    assert diff.returncode == 0, diff.stderr
    text = diff.stdout.decode()
    assert "+print(42)" in text and "+++ b/notes.txt" in text and "--- a/bin.dat" in text

    archive = tmp_path / "after1.tar.gz"
    done = cli(env, "export", run_id, "-o", str(archive), "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["turn"] == 1 and facts["bytes"] == archive.stat().st_size
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert {"notes.txt", "src/app.py", "README.md"} <= names
        assert not any(n.startswith((".home", ".git")) for n in names), names
        member = tar.extractfile("src/app.py")
        assert member is not None and member.read() == b"print('hello')\nprint(42)\n"

    rewound = cli(env, "rewind", run_id, "0", "--json")
    assert rewound.returncode == 0, rewound.stderr
    summary = json.loads(rewound.stdout)
    assert summary["rewound_to"] == 0 and summary["added"] == ["bin.dat"]
    assert summary["deleted"] == ["notes.txt"] and summary["modified"] == ["src/app.py"]

    # The next turn sees the rewound workspace, and its stream records the rewind first.
    client.submit_turn(run_id, script("look", run_cmd("ls;cat src/app.py"), "@complete ok"))
    events = turn_events(client, run_id, 2)
    assert [e.type for e in events][:2] == ["turn-started", "workspace"]
    assert events[1].data["rewound_to"] == 0
    listing = json.dumps([e.data for e in events if e.type == "assistant-text"])
    assert "notes.txt" not in listing and "bin.dat" in listing and "print(42)" not in listing
    change = workspace_event(events[2:])
    assert change["added"] == [] and change["modified"] == [] and change["deleted"] == []
    assert server.log("seed.git", "agent/work")[:2] == ["look", "rewind to turn 0"]


def test_archive_seed_upload_and_the_export_ceiling(
    deployment: tuple[Env, WorkerProcess], client: HarnessClient, tmp_path: Path
) -> None:
    env, _ = deployment
    archive = tmp_path / "seed.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        files = {"hello.txt": b"hello from the archive\n", "big.bin": b"\0" * 150_000}
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    done = cli(
        env,
        "run",
        "stdio-json",
        script("read", run_cmd("cat hello.txt;echo more>>big.bin"), "@complete ok"),
        "--executable",
        DEMO,
        "--archive",
        str(archive),
        "--follow",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    run_id = lines[0]["run_id"]
    try:
        assert "hello from the archive" in json.dumps(lines)
        record = client.status(run_id)
        assert record["seed"].startswith("archive sha256:")
        # The upload is gone once unpacked.
        assert not env.redis().exists(env.keys.upload(run_id))
        # 150 KB is under this deployment's 200 KB export ceiling; a second copy is above.
        client.submit_turn(run_id, script("grow", run_cmd("cp big.bin big2.bin"), "@complete"))
        client.wait(run_id, 2, timeout=60)
        refused = cli(env, "export", run_id, "-o", str(tmp_path / "x.tar.gz"))
        assert refused.returncode == 1
        assert b"export ceiling of 200000 bytes" in refused.stderr, refused.stderr
        assert not (tmp_path / "x.tar.gz").exists()
        ok = cli(env, "export", run_id, "-o", str(tmp_path / "one.tar.gz"), "--turn", "0")
        assert ok.returncode == 0, ok.stderr
    finally:
        client.end(run_id, timeout=30)


@pytest.mark.parametrize(
    ("repo", "ref", "words"),
    [
        ("seed.git", "no-such-branch", "no-such-branch"),
        ("missing.git", None, "missing.git"),
    ],
)
def test_a_failed_clone_ends_the_first_turn_and_leaves_nothing(
    deployment: tuple[Env, WorkerProcess],
    client: HarnessClient,
    server: GitServer,
    repo: str,
    ref: str | None,
    words: str,
) -> None:
    env, worker = deployment
    run_id = client.start_run(
        "stdio-json", "@complete never", executable=DEMO, repo=server.url(repo), ref=ref
    )
    events = turn_events(client, run_id, 1)
    terminal = events[-1]
    assert terminal.type == "session-error" and terminal.data["reason"] == "invalid-input"
    assert words in terminal.data["error"] and TOKEN not in terminal.data["error"]
    assert client.status(run_id)["status"] == "failed"
    root = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker"
    assert not (root / "run" / run_id).exists()
    assert not (root / "snapshots" / run_id).exists()
    assert TOKEN not in worker.logs()


def test_an_unreachable_repository_ends_the_first_turn_retryable_and_leaves_nothing(
    deployment: tuple[Env, WorkerProcess], client: HarnessClient
) -> None:
    """Not the producer's mistake: reason ``sandbox`` (retryable), not ``invalid-input``."""
    env, _ = deployment
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    run_id = client.start_run(
        "stdio-json", "@complete never", executable=DEMO, repo=f"http://127.0.0.1:{closed}/r.git"
    )
    terminal = turn_events(client, run_id, 1)[-1]
    assert terminal.type == "session-error", terminal
    assert terminal.data["reason"] == "sandbox" and terminal.data["retryable"] is True
    assert "cannot read the repository" in terminal.data["error"]
    assert TOKEN not in terminal.data["error"]
    assert client.status(run_id)["status"] == "failed"
    root = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker"
    assert not (root / "run" / run_id).exists()
    assert not (root / "snapshots" / run_id).exists()


def test_seed_refusals_up_front(client: HarnessClient, server: GitServer) -> None:
    with pytest.raises(InvalidInput, match="scheme"):
        client.start_run("stdio-json", "x", executable=DEMO, repo="ftp://127.0.0.1/seed.git")
    with pytest.raises(InvalidInput, match=r"credentials|user"):
        client.start_run(
            "stdio-json", "x", executable=DEMO, repo=f"http://u:p@127.0.0.1:{server.port}/s"
        )
    with pytest.raises(InvalidInput, match="not both"):
        client.start_run(
            "stdio-json", "x", executable=DEMO, repo=server.url("seed.git"), archive=__file__
        )


def test_rewind_is_refused_while_a_turn_runs(
    deployment: tuple[Env, WorkerProcess], client: HarnessClient
) -> None:
    run_id = client.start_run("stdio-json", "@complete one", executable=DEMO)
    client.wait(run_id, 1, timeout=60)
    client.submit_turn(run_id, "@sleep 5\n@complete two")
    with pytest.raises(RunBusy):
        client.rewind(run_id, 1)
    client.cancel(run_id)
    client.wait(run_id, 2, timeout=60)
    assert client.rewind(run_id, 1)["rewound_to"] == 1


def test_an_agent_that_plants_git_config_hooks_filters_and_links_runs_nothing_on_the_worker(
    deployment: tuple[Env, WorkerProcess], client: HarnessClient, server: GitServer, tmp_path: Path
) -> None:
    """The harness, inside its container, turns its workspace into a trap for a worker that
    would run git there: fsmonitor, hooks, a filter and a diff driver that touch a marker on
    the worker's host, a `.gitattributes` asking for them, and links to the host's files.
    Snapshot, diff, export and rewind run none of it and export links, never their targets."""
    env, _ = deployment
    marker = tmp_path / "pwned"
    trap = f"touch {marker}"
    plant = script(
        "plant traps",
        run_cmd(f"git config core.fsmonitor '{trap}'"),
        run_cmd("git config core.hooksPath /workspace/hooks"),
        run_cmd(f"git config filter.evil.clean '{trap}'"),
        run_cmd(f"git config diff.evil.textconv '{trap}'"),
        run_cmd("mkdir -p hooks .git/hooks"),
        run_cmd(f"printf '#!/bin/sh\\n{trap}\\n'>hooks/post-commit"),
        run_cmd(f"printf '#!/bin/sh\\n{trap}\\n'>.git/hooks/pre-commit"),
        run_cmd("chmod +x hooks/post-commit .git/hooks/pre-commit"),
        run_cmd("printf '* filter=evil diff=evil export-subst\\n'>.gitattributes"),
        run_cmd("ln -s /etc/passwd passwd-link"),
        run_cmd(f"ln -s {marker.parent} host-dir-link"),
        run_cmd("echo changed>>README.md"),
        "@complete planted",
    )
    run_id = client.start_run("stdio-json", plant, executable=DEMO, repo=server.url("seed.git"))
    events = turn_events(client, run_id, 1)
    assert events[-1].type == "turn-complete", [e.as_dict() for e in events]
    change = workspace_event(events)
    assert {"passwd-link", "host-dir-link", ".gitattributes"} <= set(change["added"])
    container = docker.from_env().containers.get(client.status(run_id)["container_id"])
    planted = container.exec_run(["git", "-C", "/workspace", "config", "core.fsmonitor"])
    # The traps are really there (as sh runs them: ${IFS} is a space to the shell).
    assert planted.output.decode().strip() == trap.replace(" ", "${IFS}")
    assert cli(env, "diff", run_id).returncode == 0
    archive = tmp_path / "trap.tar.gz"
    assert cli(env, "export", run_id, "-o", str(archive)).returncode == 0
    with tarfile.open(archive) as tar:
        link = tar.getmember("passwd-link")
        assert link.issym() and link.linkname == "/etc/passwd"
        assert not any(name.startswith("host-dir-link/") for name in tar.getnames())
    assert cli(env, "rewind", run_id, "0").returncode == 0
    client.submit_turn(run_id, "@complete after")
    turn_events(client, run_id, 2)
    assert not marker.exists()
    assert Path("/etc/passwd").read_text()  # untouched, still a file


def test_a_hostile_archive_ends_the_first_turn_invalid_input_and_leaves_nothing(
    deployment: tuple[Env, WorkerProcess], client: HarnessClient, tmp_path: Path
) -> None:
    env, _ = deployment
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("fine.txt", "../escaped.txt"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
    run_id = client.start_run("stdio-json", "@complete never", executable=DEMO, archive=archive)
    events = turn_events(client, run_id, 1)
    terminal = events[-1]
    assert terminal.type == "session-error" and terminal.data["reason"] == "invalid-input"
    assert "escaped.txt" in terminal.data["error"], terminal.data
    assert client.status(run_id)["status"] == "failed"
    root = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker"
    assert not (root / "run" / run_id).exists() and not (root / "run" / "escaped.txt").exists()
    assert not (root / "snapshots" / run_id).exists()
    assert not env.redis().exists(env.keys.upload(run_id))  # the upload is gone too
