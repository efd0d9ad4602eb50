"""Work in and out with the five real CLIs: a run seeded from a repository on a real git
server, a turn in which the model's tool call edits the workspace, then from another process
``diff``, ``export`` and ``rewind 0``, and a next turn that works on the rewound workspace.

The edit is a shell command (the fake model's ``edit`` scenario), so the snapshot is shown to
catch what a harness's shell did, not only its own file-editing tools.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import HARNESSES, Deployment, Harness, nonce
from tests.fakemodel.scenarios import EDIT_COMMAND
from tests.gitserver import GitServer, git_server
from tests.helpers import assert_one_terminal

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.docker,
    pytest.mark.redis,
    pytest.mark.celery,
]

ALL = pytest.mark.parametrize("harness", list(HARNESSES.values()), ids=list(HARNESSES))
SEED = {"README.md": "seed line\n", "src/app.py": "print('hello')\n"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    with git_server(tmp_path_factory.mktemp("git") / "repos") as s:
        s.create("seed.git", SEED)
        yield s


@ALL
def test_seeded_run_edit_diff_export_rewind_and_next_turn(
    e2e: Deployment, harness: Harness, server: GitServer, tmp_path: Path
) -> None:
    word = nonce()
    first = e2e.run(
        harness,
        f"[scenario:edit] edit the files {word}",
        "--posture",
        "dangerous",
        "--repo",
        server.url("seed.git"),
    )
    assert first.terminal["type"] == "turn-complete", first.describe()
    assert_one_terminal(first.events, 1)
    (change,) = first.of_type("workspace")
    assert first.events[-2]["type"] == "workspace", first.describe()
    assert change["added"] == ["agent.txt"], change
    assert change["modified"] == ["README.md"], change
    assert change["lines_added"] == 2 and change["lines_removed"] == 0, change
    run_id = first.run_id
    activity = json.dumps(first.of_type("sandbox-activity"))
    assert "edit-ran" in activity or EDIT_COMMAND.split(" ")[0] in activity

    diff = e2e.cli("diff", run_id, "--turn", "1")
    assert diff.returncode == 0, diff.stderr
    assert "+agent-line" in diff.stdout and "+made-by-agent" in diff.stdout, diff.stdout

    archive = tmp_path / "work.tar.gz"
    done = e2e.cli("export", run_id, "-o", str(archive))
    assert done.returncode == 0, done.stderr
    with tarfile.open(archive) as tar:
        member = tar.extractfile("agent.txt")
        assert member is not None and member.read() == b"made-by-agent\n"
        readme = tar.extractfile("README.md")
        assert readme is not None and readme.read() == b"seed line\nagent-line\n"

    rewound = e2e.cli("rewind", run_id, "0", "--json")
    assert rewound.returncode == 0, rewound.stderr
    assert json.loads(rewound.stdout)["deleted"] == ["agent.txt"]
    _, out = e2e.container(run_id).exec_run(["sh", "-c", "ls /workspace; cat README.md"])
    assert "agent.txt" not in out.decode() and "agent-line" not in out.decode(), out

    second = e2e.turn(run_id, f"[scenario:text] and now {word}")
    assert second.terminal["type"] == "turn-complete", second.describe()
    assert_one_terminal(second.events, 2)
    assert [e["type"] for e in second.events][:2] == ["turn-started", "workspace"]
    assert second.events[1]["data"]["rewound_to"] == 0
    (_, after) = second.of_type("workspace")
    assert after["added"] == [] and after["modified"] == [] and after["deleted"] == []
