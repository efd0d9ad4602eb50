"""Clients generated from ``/openapi.json`` drive a run end to end against a real API, Redis
and worker: Python (openapi-python-client) and TypeScript (openapi-typescript types with
openapi-fetch, compiled by tsc and run by Node). Each creates a run whose demo harness asks
for a permission (``--posture ask``), follows its events, allows the request, sends a second
turn (from Python a third too, with a file: the multipart form) and ends the run. The
generators are installed by scripts/install-openapi-generators (pinned in
tests/integration/openapi_clients/; quick once installed)."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.conftest import DEMO

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

CLIENTS = Path(__file__).parent / "openapi_clients"
PACKAGE = "harness_api_client"
GENERATOR_CONFIG = {
    # The export's tar.gz: generated as bytes, as application/octet-stream is.
    "content_type_overrides": {"application/gzip": "application/octet-stream"},
}


@pytest.fixture(scope="module")
def generators() -> Path:
    if not shutil.which("npm"):
        pytest.fail("npm is needed to install the TypeScript generator")
    done = subprocess.run(
        [str(ROOT / "scripts" / "install-openapi-generators")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


@pytest.fixture(scope="module")
def document(api: ApiProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    path = tmp_path_factory.mktemp("openapi") / "openapi.json"
    path.write_bytes(httpx.get(f"{api.url}/openapi.json").content)
    return path


@pytest.fixture(scope="module")
def python_client(generators: Path, document: Path) -> Iterator[ModuleType]:
    out = document.parent / "python"
    config = document.parent / "config.json"
    config.write_text(json.dumps(GENERATOR_CONFIG))
    done = subprocess.run(
        [
            str(generators / "python" / "bin" / "openapi-python-client"),
            "generate",
            "--path",
            str(document),
            "--meta",
            "none",
            "--output-path",
            str(out / PACKAGE),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout, done.stdout  # no operation or answer left out
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def test_a_generated_python_client_drives_a_run(
    api: ApiProcess,  # noqa: F811
    python_client: ModuleType,
) -> None:
    from harness_api_client import AuthenticatedClient  # type: ignore[import-not-found]
    from harness_api_client.api.default import (  # type: ignore[import-not-found]
        answer_permission,
        create_run,
        end_run,
        get_run,
        list_events,
        list_permissions,
        submit_turn,
    )
    from harness_api_client.models import (  # type: ignore[import-not-found]
        Decision,
        DecisionDecision,
        ErrorBody,
        PermissionRequestEvent,
        RunCreate,
        RunCreatePostureType0,
        RunStatusRecord,
        SubmitTurnFilesBody,
        TurnCompleteEvent,
        TurnCreate,
    )
    from harness_api_client.types import File  # type: ignore[import-not-found]

    client = AuthenticatedClient(base_url=api.url, token=api.keys["acme"], timeout=60)
    created = create_run.sync(
        client=client,
        body=RunCreate(
            harness="stdio-json",
            input_="@ask touch from-python.txt",
            executable=DEMO,
            posture=RunCreatePostureType0.ASK,
        ),
    )
    run_id = created.run_id
    assert created.turn == 1

    def until(kind: type, turn: int) -> Any:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for event in list_events.sync(run_id, client=client):
                if isinstance(event, kind) and event.id.startswith(f"{turn}-"):
                    return event
            time.sleep(0.1)
        raise AssertionError(f"no {kind.__name__} in turn {turn} of {run_id}")

    asked = until(PermissionRequestEvent, 1)
    [pending] = list_permissions.sync(run_id, client=client)
    assert pending.request_id == asked.data.request_id
    assert pending.command == "touch from-python.txt"
    answer = answer_permission.sync(
        run_id,
        asked.data.request_id,
        client=client,
        body=Decision(decision=DecisionDecision.ALLOW),
    )
    assert answer.decision == "allow" and answer.by.startswith("api:acme")
    assert until(TurnCompleteEvent, 1).data.exit_code in (0, None)

    accepted = submit_turn.sync(run_id, client=client, body=TurnCreate(input_="@complete second"))
    assert accepted.turn == 2
    assert until(TurnCompleteEvent, 2).data.text == "second"

    # Files go as the multipart form, the turn's JSON in its part.
    files = SubmitTurnFilesBody(
        turn=TurnCreate(input_="@answer-attachments"),
        attachment=[File(payload=io.BytesIO(b"hello"), file_name="notes.txt")],
    )
    assert submit_turn.sync(run_id, client=client, body=files).turn == 3
    answered = json.loads(until(TurnCompleteEvent, 3).data.text)
    [attached] = answered["attachments"]
    assert attached["path"].endswith(".attachments/turn-3/notes.txt")
    assert attached["sha256"] == hashlib.sha256(b"hello").hexdigest()

    record = end_run.sync(run_id, client=client, wait=30)
    assert record.status == "ended" and record.turns == 3
    status = get_run.sync(run_id, client=client)
    assert isinstance(status, RunStatusRecord) and status.status == "ended"
    missing = get_run.sync("r" + "0" * 24, client=client)
    assert isinstance(missing, ErrorBody) and missing.error.type_ == "not_found"


def test_a_generated_typescript_client_drives_a_run_under_node(
    api: ApiProcess,  # noqa: F811
    generators: Path,
    document: Path,
) -> None:
    work = document.parent / "typescript"
    work.mkdir()
    for name in ("package.json", "tsconfig.json", "drive.ts"):
        shutil.copy(CLIENTS / name, work / name)
    (work / "node_modules").symlink_to(generators / "node" / "node_modules")
    tools = generators / "node" / "node_modules" / ".bin"

    def run(*argv: str, timeout: float = 300) -> str:
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    # A field with a default is optional in a request (the generator's default makes it
    # required, as in an answer).
    run(
        str(tools / "openapi-typescript"),
        str(document),
        "--output",
        "api.d.ts",
        "--default-non-nullable",
        "false",
    )
    run(str(tools / "tsc"), "-p", ".")  # the driver type-checks against the generated types
    seen = json.loads(run("node", "drive.js", api.url, api.keys["acme"], str(DEMO)))
    kinds = [line.split(" ", 1)[1] for line in seen["seen"]]
    assert kinds.index("permission-request") < kinds.index("permission-decision")
    assert kinds.count("turn-complete") == 2 and "session-error" not in kinds
    assert seen["answered_by"].startswith("api:acme")
    assert seen["answers"][1] == "second from typescript"
    assert seen["ended"] == seen["status"] == "ended" and seen["turns"] == 2
    assert seen["missing"] == {"status": 404, "type": "not_found"}
