"""Point 2: identifiers and names are checked where they enter, and nothing a producer names
reaches a shell, a path outside the workspace, a Redis key pattern, or a command's flags.

Services: none, except the last test (a real worker fed forged Celery messages).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import adapters
from adapters.protocol import TurnRequest
from config import SettingsError, load_settings
from tests.integration.conftest import Env, WorkerProcess, make_env
from tests.security.conftest import start_scoped_worker
from worker.app_names import TASK_RUN_TURN, harness_queue
from worker.client import HarnessClient
from worker.errors import InvalidInput
from worker.options.policy import resolve, resolve_secrets
from worker.options.spec import RunOptions, TurnPayload, check_run_id, new_run_id
from worker.store.keys import Keys

pytestmark = pytest.mark.usefixtures("shipped_settings")

TRAVERSAL = ["..", "../x", "../../etc/passwd", "a/../../b", "/etc/passwd", "a/b", ".", "a\\..\\b"]
GLOB = ["*", "r*", "?", "[a-z]", "r" + "0" * 23 + "*"]


# -- run ids and Redis keys ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_id",
    [
        *TRAVERSAL,
        *GLOB,
        "",
        "r" + "0" * 24 + "\n",
        "r" + "0" * 24 + ":events",
        "r" + "A" * 24,
        "r" + "0" * 25,
        " r" + "0" * 24,
    ],
)
def test_malformed_run_ids_refused_at_every_entry(run_id: str) -> None:
    with pytest.raises(InvalidInput, match="invalid run id"):
        check_run_id(run_id)
    with pytest.raises(ValidationError):
        TurnPayload(run_id=run_id, turn=1, input="x")


def test_redis_keys_hold_no_pattern_characters_and_stay_under_the_prefix() -> None:
    keys = Keys("t-1.x_y")
    run_id = new_run_id()
    names = [
        keys.run(run_id),
        keys.events(run_id),
        keys.transcript(run_id),
        keys.turn_started(run_id, 3),
        keys.turn_owner(run_id, 3),
        keys.cancel(run_id, 3),
        keys.credential(run_id),
        keys.runs_index(),
        keys.hosts(),
    ]
    for name in names:
        assert name.startswith("t-1.x_y:")
        assert not re.search(r"[*?\[\]\\\s]", name), name


@pytest.mark.parametrize("prefix", ["a*", "a:b", "a b", "", "x" * 33, "a/b", "h?"])
def test_key_prefix_that_could_be_a_pattern_refused(prefix: str) -> None:
    with pytest.raises(SettingsError, match="HARNESS_KEY_PREFIX"):
        load_settings(key_prefix=prefix)


# -- harness ids and queue names ---------------------------------------------------------------


@pytest.mark.parametrize("harness", ["../pi", "pi\n", "PI", " pi", "pi ", "stdio_json", "*"])
def test_harness_id_is_one_of_the_closed_set(harness: str) -> None:
    with pytest.raises(ValidationError, match="unknown harness"):
        RunOptions(harness=harness)
    with pytest.raises(ValueError, match="unknown harness"):
        adapters.get(harness)


def test_queue_names_come_only_from_known_harness_ids() -> None:
    for harness in adapters.HARNESS_IDS:
        assert re.fullmatch(r"harness\.[a-z-]+", harness_queue(harness))


# -- environment names (grants) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["A=B", "PATH;x", "1X", "A-B", "A B", "", "X\x00", "../X", "Ä", "X" * 129]
)
def test_grant_names_must_be_environment_variable_names(name: str) -> None:
    with pytest.raises(ValidationError, match="grant name"):
        RunOptions(harness="stdio-json", executable="harness-demo", grants=(name,))


@pytest.mark.parametrize(
    "name", ["HARNESS_REDIS_URL", "HARNESS_BROKER_URL", "HARNESS_RUN_TOKEN", "HARNESS_TURN"]
)
def test_worker_variables_never_granted_even_when_policy_allows_anything(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "redis://:worker-password@redis:6379/0")
    policy = load_settings(grants="stdio-json=*")
    options = RunOptions(harness="stdio-json", executable="harness-demo", grants=(name,))
    with pytest.raises(InvalidInput, match=name):
        resolve(options, policy)
    with pytest.raises(InvalidInput, match=name):
        resolve_secrets(options, policy)


# -- image references ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "--privileged",
        "-v/:/host",
        "img:tag\n",
        "img:tag;rm",
        "img:tag rm",
        "../x",
        "/abs/path",
        "img@sha256:" + "g" * 64,
        "img:" + "t" * 129,
        "a" * 256,
        "$(id)",
    ],
)
def test_image_references_that_are_not_references_refused(image: str) -> None:
    with pytest.raises(ValidationError, match="image"):
        RunOptions(harness="pi", image=image)


# -- nothing becomes a flag -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", "--dangerously-skip-permissions"),
        ("model", "-c"),
        ("resume_session", "--yolo"),
        ("resume_session", "-"),
        ("allow", ("Bash", "--dangerously-skip-permissions")),
        ("deny", ("--mcp-config=/tmp/x",)),
    ],
)
def test_values_that_would_become_flags_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        RunOptions(harness="claude-code", **{field: value})


@pytest.mark.parametrize("harness", [h for h in adapters.HARNESS_IDS if h != "stdio-json"])
def test_every_producer_value_in_argv_is_a_whole_value_never_a_flag(harness: str) -> None:
    """Build each adapter's command from every producer-set field at once: the input is on
    stdin, the values that land in argv are whole elements, files stay under HOME."""
    options = RunOptions(
        harness=harness,
        model="model-x",
        resume_session="0199a-session",
        allow=("Bash(git status:*)",),
        deny=("WebFetch",),
        system_prompt="be brief; $(id) `id` --flag",
        base_url="http://127.0.0.1:9/v1",
    )
    request = TurnRequest(
        input="--help; $(touch /workspace/pwned)",
        model=options.model,
        system_prompt=options.system_prompt,
        posture="strict",
        allow=options.allow,
        deny=options.deny,
        resume_session=options.resume_session,
        base_url=options.base_url,
    )
    command = adapters.get(harness).build_command(request)
    assert request.input not in command.argv  # the input goes on stdin, never argv
    assert command.stdin == request.input.encode()
    for value in ("model-x", "0199a-session"):  # whole argv elements, never a flag's prefix
        assert value in command.argv or any(v.endswith("/" + value) for v in command.argv)
    for path in command.files:
        normal = posixpath.normpath(path)
        assert normal.startswith(request.home + "/") or normal.startswith(request.workspace + "/")


def test_sandbox_refuses_files_outside_the_workspace() -> None:
    from sandbox.base import StartFailed
    from sandbox.docker.container import files_archive

    for path in ["/workspace/../etc/passwd", "relative/x", "/etc/x", "/workspace", "/workspacex/y"]:
        with pytest.raises(StartFailed, match="refusing to write"):
            files_archive({path: "x"}, "/workspace")
    assert files_archive({"/workspace/.home/a/b": "x"}, "/workspace")


# -- paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*TRAVERSAL, "", ".hidden", "-x", "a" * 65, "a\nb", "a b"])
def test_workspace_names_that_are_not_plain_names_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="workspace"):
        RunOptions(harness="pi", workspace=name)


def test_local_sandbox_refuses_names_that_leave_its_directory() -> None:
    from sandbox.base import SandboxError
    from sandbox.workspace import safe_name

    for name in [*TRAVERSAL, "", "a..b", "-x"]:
        with pytest.raises(SandboxError):
            safe_name(name, "run id")


# -- a worker handed forged messages -----------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path, redis_url)
    yield e
    for client in e.clients:
        client.close()


@pytest.mark.redis
@pytest.mark.celery
def test_worker_ignores_forged_turn_messages_and_creates_nothing(env: Env) -> None:
    worker: WorkerProcess = start_scoped_worker(env)
    try:
        client: HarnessClient = env.client()
        queue = harness_queue("stdio-json", env.prefix)
        forged: list[Any] = [
            {"run_id": "../../../tmp/pwned", "turn": 1, "input": "x"},
            {"run_id": "r" + "0" * 24, "turn": 1, "input": "x"},  # no such run
            {"run_id": "*", "turn": 1, "input": "x"},
            {"run_id": new_run_id(), "turn": 0, "input": "x"},
            {"run_id": new_run_id(), "turn": 1, "input": "x", "secret": "y"},
            "not a payload",
        ]
        for payload in forged:
            client.app.send_task(TASK_RUN_TURN, args=[payload], queue=queue)
        # A real turn after them: the worker is alive and answers normally.
        run_id = client.start_run("stdio-json", "still here", executable=_demo())
        assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    finally:
        worker.stop()
    r = env.redis()
    runs = {key.split(":")[2] for key in r.scan_iter(f"{env.prefix}:run:*")}
    assert runs == {run_id}
    workspaces = Path(env.vars["HARNESS_WORKSPACE_ROOT"]) / "local" / "run"
    assert {p.name.split(".")[0] for p in workspaces.iterdir()} <= {run_id}
    assert not Path("/tmp/pwned").exists()


def _demo() -> str:
    from tests.integration.conftest import DEMO

    return DEMO
