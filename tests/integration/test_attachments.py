"""Files and images into a turn and a validated result out, through a real worker (local
sandbox) and the demo harness: uploaded through Redis, written into the workspace at
``.attachments/turn-N/``, listed in ``HARNESS_ATTACHMENTS``; an answer checked against the
turn's output schema (``structured`` in ``turn-complete``, or ``invalid-output``); what the
client refuses (nothing created) and what the worker refuses again."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_terminal
from tests.images import jpeg, png
from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.conftest import DEMO, Env, WorkerProcess, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from worker.client import HarnessClient, StreamEvent
from worker.client.workspace import Loaded
from worker.errors import InvalidInput

pytestmark = [pytest.mark.redis, pytest.mark.celery]

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "attachments": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
                "required": ["path", "media_type", "sha256"],
            },
        }
    },
    "required": ["attachments"],
}
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"type": "string"}},
    "required": ["verdict"],
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    made = {"red.png": png(), "notes.txt": b"remember the milk\n", "photo.png": jpeg()}
    for name, data in made.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in made}


def workspace_of(env: Env, run_id: str) -> Path:
    return env.tmp / "workspaces" / "local" / "run" / run_id


def turn_events(client: HarnessClient, run_id: str, turn: int) -> list[StreamEvent]:
    return [e for e in client.events(run_id) if e.turn == turn]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_attached_files_reach_the_harness_and_its_answer_is_structured(
    shared_env: Env, shared_worker: WorkerProcess, files: dict[str, Path]
) -> None:
    client = shared_env.client()
    run_id = client.start_run(
        "stdio-json",
        "@answer-attachments",
        executable=DEMO,
        attachments=[files["red.png"], str(files["notes.txt"])],
        output_schema=ANSWER_SCHEMA,
    )
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.type == "turn-complete", terminal.data
    workspace = workspace_of(shared_env, run_id)
    written = workspace / ".attachments" / "turn-1"
    assert sorted(p.name for p in written.iterdir()) == ["notes.txt", "red.png"]
    assert (written / "red.png").read_bytes() == png()
    assert terminal.data["structured"] == {
        "attachments": [
            {
                "path": str(written / "red.png"),
                "media_type": "image/png",
                "sha256": sha(files["red.png"]),
            },
            {
                "path": str(written / "notes.txt"),
                "media_type": "application/octet-stream",
                "sha256": sha(files["notes.txt"]),
            },
        ]
    }
    assert json.loads(terminal.data["text"]) == terminal.data["structured"]
    record = client.status(run_id)
    assert record["options"]["output_schema"] == ANSWER_SCHEMA
    # stdio-json has no image input: the run says its image reached it as a file only.
    assert any("no image input" in w for w in record["warnings"] or [])
    # The uploads are gone from Redis once the worker has them.
    r = shared_env.redis()
    assert not list(r.scan_iter(f"{shared_env.prefix}:run:{run_id}:turn:*:attachment:*"))
    assert_one_terminal(turn_events(client, run_id, 1))


def test_a_later_turn_carries_its_own_files_and_its_own_schema(
    shared_env: Env, shared_worker: WorkerProcess, files: dict[str, Path]
) -> None:
    client = shared_env.client()
    run_id = client.start_run("stdio-json", "hello", executable=DEMO)
    assert client.wait(run_id, 1, timeout=60).type == "turn-complete"
    turn = client.submit_turn(
        run_id,
        '@attachments\n@complete {"verdict": "read it"}',
        attachments=[files["notes.txt"]],
        output_schema=VERDICT_SCHEMA,
    )
    terminal = client.wait(run_id, turn, timeout=60)
    assert terminal.type == "turn-complete" and terminal.data["structured"] == {
        "verdict": "read it"
    }
    path = workspace_of(shared_env, run_id) / ".attachments" / "turn-2" / "notes.txt"
    texts = [
        e.data["text"] for e in turn_events(client, run_id, turn) if e.type == "assistant-text"
    ]
    assert f"attachment {path} application/octet-stream 18 {sha(files['notes.txt'])}" in texts
    # A turn without a schema of its own and none on the run: no structured.
    plain = client.submit_turn(run_id, "@complete not json at all")
    done = client.wait(run_id, plain, timeout=60)
    assert done.type == "turn-complete" and "structured" not in done.data


def test_an_answer_that_breaks_the_schema_ends_the_turn_invalid_output(
    shared_env: Env, shared_worker: WorkerProcess
) -> None:
    client = shared_env.client()
    run_id = client.start_run(
        "stdio-json", '@complete {"verdict": 42}', executable=DEMO, output_schema=VERDICT_SCHEMA
    )
    terminal = client.wait(run_id, 1, timeout=60)
    assert terminal.type == "session-error", terminal.data
    assert terminal.data["reason"] == "invalid-output"
    assert terminal.data["retryable"] is False
    assert "42 is not of type 'string' (at /verdict" in terminal.data["error"]
    assert_one_terminal(turn_events(client, run_id, 1))
    record = client.status(run_id)
    assert record["status"] == "idle"  # the run goes on: the next turn may answer well
    assert record["last_error"].startswith("invalid-output: ")
    again = client.submit_turn(run_id, "@complete no JSON here")
    prose = client.wait(run_id, again, timeout=60)
    assert prose.data["reason"] == "invalid-output"
    assert "holds no JSON value" in prose.data["error"]


def test_what_the_client_refuses_creates_nothing(
    shared_env: Env, files: dict[str, Path], tmp_path: Path
) -> None:
    client = shared_env.client(attach_max_bytes=1000, attach_max_files=2)
    r = shared_env.redis()
    before = set(r.scan_iter(f"{shared_env.prefix}:*"))
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 1001)
    cut = tmp_path / "cut.png"
    cut.write_bytes(png()[:20])
    refusals = [
        ({"attachments": [big]}, "'big.bin' is 1001 bytes, over the operator's limit of 1000"),
        ({"attachments": [files["notes.txt"]] * 3}, "3 attachments, over the operator's limit"),
        (
            {"attachments": [files["photo.png"]]},
            "'photo.png' is named as a PNG image but its bytes are a JPEG",
        ),
        ({"attachments": [cut]}, "'cut.png' is an unreadable PNG image"),
        ({"attachments": [tmp_path / "gone.png"]}, "cannot read the attachment"),
        ({"attachments": [files["notes.txt"], files["notes.txt"]]}, "both be named 'notes.txt'"),
        ({"output_schema": {"type": "objekt"}}, "not a valid JSON Schema"),
        ({"output_schema": {"required": "verdict"}}, "not a valid JSON Schema"),
    ]
    for options, message in refusals:
        with pytest.raises(InvalidInput, match=message):
            client.start_run("stdio-json", "hi", executable=DEMO, **options)
    # Nothing new (an earlier test's turn may still be dropping its owner key meanwhile).
    assert set(r.scan_iter(f"{shared_env.prefix}:*")) - before == set()


def test_the_worker_checks_the_uploaded_bytes_again(
    env: Env, workers: list[WorkerProcess], files: dict[str, Path]
) -> None:
    workers.append(start_worker(env, HARNESS_ATTACH_MAX_BYTES="50"))
    generous = env.client(attach_max_bytes=10_000)
    # Over the worker's own bound, whatever the client allowed.
    run_id = generous.start_run("stdio-json", "hi", executable=DEMO, attachments=[files["red.png"]])
    refused = generous.wait(run_id, 1, timeout=60)
    assert refused.data["reason"] == "invalid-input"
    assert "HARNESS_ATTACH_MAX_BYTES" in refused.data["error"]
    assert generous.status(run_id)["status"] == "failed"
    uploads = f"{env.prefix}:run:{run_id}:turn:*:attachment:*"
    assert not list(env.redis().scan_iter(uploads))  # a refused turn's uploads are gone too
    # Bytes that are not what the message says (swapped in Redis after the client checked).
    client = env.client()
    original = client.workspace.upload_attachments

    def swapped(run: str, turn: int, loaded: list[Loaded]) -> Any:
        refs = original(run, turn, loaded)
        key = client.keys.attachment(run, turn, 0)
        client.workspace.binary.delete(key)
        client.workspace.binary.rpush(key, b"x" * loaded[0].ref.size)
        return refs

    client.workspace.upload_attachments = swapped  # type: ignore[method-assign]
    first = client.start_run("stdio-json", "hi", executable=DEMO)
    assert client.wait(first, 1, timeout=60).type == "turn-complete"
    turn = client.submit_turn(first, "look", attachments=[files["notes.txt"]])
    mismatch = client.wait(first, turn, timeout=60)
    assert mismatch.data["reason"] == "invalid-input"
    assert "does not match its SHA-256" in mismatch.data["error"]
    assert client.status(first)["status"] == "idle"
    assert not (workspace_of(env, first) / ".attachments" / "turn-2").exists()


def cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **env.vars},
    )


def test_the_command_line_attaches_files_and_reads_the_schema(
    shared_env: Env, shared_worker: WorkerProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    schema = tmp_path / "answer.json"
    schema.write_text(json.dumps(ANSWER_SCHEMA))
    done = cli(
        shared_env,
        "run", "stdio-json", "@answer-attachments", "--executable", DEMO,
        "--attach", str(files["red.png"]), "--attach", str(files["notes.txt"]),
        "--output-schema", str(schema), "--follow", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["type"] == "turn-complete"
    assert [a["sha256"] for a in last["data"]["structured"]["attachments"]] == [
        sha(files["red.png"]),
        sha(files["notes.txt"]),
    ]
    not_a_schema = tmp_path / "bad.json"
    not_a_schema.write_text('{"type": "objekt"}')
    bad = cli(
        shared_env,
        "run",
        "stdio-json",
        "hi",
        "--executable",
        DEMO,
        "--output-schema",
        str(not_a_schema),
    )
    assert bad.returncode == 2 and "not a valid JSON Schema" in bad.stderr
    unparsable = tmp_path / "text.json"
    unparsable.write_text("{type: object}")
    assert (
        "is not JSON"
        in cli(shared_env, "run", "stdio-json", "hi", "--output-schema", str(unparsable)).stderr
    )
    mislabeled = cli(
        shared_env,
        "run",
        "stdio-json",
        "hi",
        "--executable",
        DEMO,
        "--attach",
        str(files["photo.png"]),
    )
    assert mislabeled.returncode == 2 and "named as a PNG image" in mislabeled.stderr


@pytest.mark.docker
def test_in_a_container_the_harness_reads_its_attachments_in_the_workspace(
    env: Env, workers: list[WorkerProcess], files: dict[str, Path]
) -> None:
    require_docker()
    ensure_images(["demo"])
    workers.append(
        start_worker(
            env,
            HARNESS_SANDBOX="docker",
            HARNESS_NETWORK="none",
            HARNESS_ALLOWED_EXECUTABLES="harness-demo",
        )
    )
    client = env.client()
    run_id = client.start_run(
        "stdio-json",
        "@answer-attachments",
        executable="harness-demo",
        attachments=[files["red.png"], files["notes.txt"]],
        output_schema=ANSWER_SCHEMA,
    )
    try:
        terminal = client.wait(run_id, 1, timeout=180)
        assert terminal.type == "turn-complete", terminal.data
        seen = terminal.data["structured"]["attachments"]
        assert [(a["path"], a["sha256"]) for a in seen] == [
            ("/workspace/.attachments/turn-1/red.png", sha(files["red.png"])),
            ("/workspace/.attachments/turn-1/notes.txt", sha(files["notes.txt"])),
        ]
    finally:
        client.end(run_id, timeout=60)


def test_the_http_api_takes_the_output_schema_and_returns_the_structured_result(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        body = {"harness": "stdio-json", "executable": DEMO, "output_schema": VERDICT_SCHEMA}
        created = http.post("/v1/runs", json={**body, "input": '@complete {"verdict": "fine"}'})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        deadline = time.monotonic() + 60
        terminal: dict[str, Any] | None = None
        while terminal is None and time.monotonic() < deadline:
            ended = [
                e
                for e in http.get(f"/v1/runs/{run_id}/events").json()
                if e["type"] in ("turn-complete", "session-error")
            ]
            terminal = ended[0] if ended else None
            time.sleep(0.1)
        assert terminal is not None and terminal["type"] == "turn-complete", terminal
        assert terminal["data"]["structured"] == {"verdict": "fine"}
        refused = http.post("/v1/runs", json={**body, "input": "hi", "output_schema": {"type": 1}})
        assert refused.status_code in (400, 422), refused.text
        assert "not a valid JSON Schema" in refused.json()["error"]["message"]
