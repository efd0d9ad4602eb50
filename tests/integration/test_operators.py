"""What operators see of a real worker: metrics, structured logs without secrets, the live
CLI on a terminal, doctor, and the deployment files."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pty
import re
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandbox.base import LABEL_SCOPE
from tests.conftest import ROOT, require
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from tests.integration.docker_fixtures import ensure_images, require_docker
from worker.app_names import TASK_REAP_HOST
from worker.cli import doctor
from worker.client import HarnessClient
from worker.observe import logs

SECRET = "grant-value-4f9c2e7d1b"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LIFECYCLE = ("turn.started", "sandbox.ready", "harness.started", "harness.exited", "turn.finished")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ops_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(tmp_path_factory.mktemp("ops"), redis_url)
    e.vars["HARNESS_METRICS_PORT"] = str(free_port())
    yield e
    for client in e.clients:
        client.close()


@pytest.fixture(scope="module")
def ops_worker(ops_env: Env) -> Iterator[WorkerProcess]:
    """A worker that holds a grantable secret, logs at debug level and serves metrics."""
    worker = start_worker(ops_env, extra_args=("--loglevel", "debug"), DEMO_TOKEN=SECRET)
    yield worker
    worker.stop()


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    return metric(after, name, **labels) - metric(before, name, **labels)


def wait_for(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not true within {timeout}s: {check}")


def run(client: HarnessClient, text: str, **options: Any) -> tuple[str, Any]:
    run_id = client.start_run("stdio-json", text, executable=DEMO, **options)
    return run_id, client.wait(run_id, 1, timeout=60)


# -- metrics ----------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.celery
def test_metrics_count_turns_by_outcome_events_and_in_flight(
    ops_env: Env, ops_worker: WorkerProcess
) -> None:
    port = int(ops_env.vars["HARNESS_METRICS_PORT"])
    client = ops_env.client()
    before = scrape(port)

    run(client, "hello metrics")
    _, failed = run(client, "@error the model refused")
    assert failed.data["reason"] == "harness-error"
    slow = client.start_run("stdio-json", "@text busy\n@sleep 30", executable=DEMO)
    for event in client.events(slow, follow=True, timeout=30):
        if event.type == "assistant-text":
            break
    assert metric(scrape(port), "harness_turns_in_flight", harness="stdio-json") == 1
    client.cancel(slow)
    client.wait(slow, 1, timeout=10)

    after = wait_for(
        lambda: (
            (s := scrape(port))
            and metric(s, "harness_turns_in_flight", harness="stdio-json") == 0
            and s
        )
    )
    assert delta(before, after, "harness_turns_started_total", harness="stdio-json") == 3
    assert delta(before, after, "harness_turns_completed_total", harness="stdio-json") == 1
    failed_by = {
        reason: delta(
            before, after, "harness_turns_failed_total", harness="stdio-json", reason=reason
        )
        for reason in ("harness-error", "cancelled", "timeout")
    }
    assert failed_by == {"harness-error": 1, "cancelled": 1, "timeout": 0}
    assert (
        delta(
            before,
            after,
            "harness_turn_duration_seconds_count",
            harness="stdio-json",
            outcome="completed",
        )
        == 1
    )
    assert (
        delta(
            before,
            after,
            "harness_turn_duration_seconds_count",
            harness="stdio-json",
            outcome="failed",
        )
        == 2
    )
    assert delta(before, after, "harness_events_published_total", type="turn-started") == 3
    assert delta(before, after, "harness_events_published_total", type="turn-complete") == 1
    assert delta(before, after, "harness_events_published_total", type="session-error") == 2
    assert metric(after, "harness_publish_retries_total") == 0
    assert ("harness_teardown_failures_total", frozenset()) in after


@pytest.mark.redis
@pytest.mark.celery
def test_reaper_counts_the_sandboxes_it_removes(ops_env: Env, ops_worker: WorkerProcess) -> None:
    port = int(ops_env.vars["HARNESS_METRICS_PORT"])
    client = ops_env.client()
    run_id, _ = run(client, "soon forgotten")
    workspace = ops_env.tmp / "workspaces" / "local" / "run" / run_id
    assert workspace.exists()
    before = scrape(port)
    # The run's record is gone (expired, or deleted by hand): its sandbox is an orphan.
    ops_env.redis().delete(ops_env.keys.run(run_id))
    client.app.send_task(TASK_REAP_HOST, queue=ops_env.settings().host_queue)
    wait_for(lambda: not workspace.exists())
    after = wait_for(
        lambda: (
            (s := scrape(port))
            and delta(before, s, "harness_containers_reaped_total", backend="local") >= 1
            and s
        )
    )
    assert delta(before, after, "harness_containers_reaped_total", backend="local") == 1


@pytest.mark.redis
@pytest.mark.celery
def test_worker_on_a_taken_metrics_port_runs_on_without_metrics(
    env: Env, workers: list[WorkerProcess]
) -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        worker = start_worker(env, HARNESS_METRICS_PORT=str(port))
        workers.append(worker)
        _, terminal = run(env.client(), "still working")
        assert terminal.type == "turn-complete"
    entries = [json.loads(line) for line in worker.logs().splitlines() if line.startswith("{")]
    unavailable = [e for e in entries if e["event"] == "metrics.unavailable"]
    assert unavailable and unavailable[0]["port"] == port and unavailable[0]["fix"]


# -- logs -------------------------------------------------------------------------------------


def log_entries(worker: WorkerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.logs().splitlines() if line.startswith("{")]


@pytest.mark.redis
@pytest.mark.celery
def test_worker_logs_one_json_line_per_lifecycle_step_with_turn_fields(
    ops_env: Env, ops_worker: WorkerProcess
) -> None:
    client = ops_env.client()
    run_id, _ = run(client, "log me")
    client.submit_turn(run_id, "and again")
    client.wait(run_id, 2, timeout=60)
    entries = wait_for(
        lambda: (
            [e for e in log_entries(ops_worker) if e.get("run_id") == run_id]
            if sum(
                e.get("run_id") == run_id and e["event"] == "turn.finished"
                for e in log_entries(ops_worker)
            )
            == 2
            else None
        )
    )
    for number in (1, 2):
        steps = [e for e in entries if e.get("turn") == number]
        assert [e["event"] for e in steps if e["event"] in LIFECYCLE] == list(LIFECYCLE)
        for entry in steps:
            assert entry["harness"] == "stdio-json"
            assert entry["level"] in ("debug", "info", "warning")
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["ts"])
    finished = [e for e in entries if e["event"] == "turn.finished"]
    assert [e["outcome"] for e in finished] == ["completed", "completed"]
    # Celery's own lines are structured too, not only ours.
    lines = ops_worker.logs().splitlines()
    received = [line for line in lines if "Task harness.run_turn[" in line]
    assert received and all(line.startswith("{") for line in received)


@pytest.mark.redis
@pytest.mark.celery
def test_worker_logs_never_hold_a_granted_secret(ops_env: Env, ops_worker: WorkerProcess) -> None:
    client = ops_env.client()
    # The harness prints the secret, writes its whole environment (the per-run credential
    # included) to its workspace, and exits without a terminal line (an error path).
    run_id, terminal = run(
        client,
        "@env DEMO_TOKEN\n@run sh -c env>env.txt\n@run cat env.txt\n@exit 3",
        grants=["DEMO_TOKEN"],
    )
    assert terminal.data["reason"] == "exit"
    texts = [e.data.get("text", "") for e in client.events(run_id) if e.type == "assistant-text"]
    assert "DEMO_TOKEN=[masked]" in texts  # the secret did reach the harness
    environ = (ops_env.tmp / "workspaces" / "local" / "run" / run_id / "env.txt").read_text()
    granted = dict(line.split("=", 1) for line in environ.splitlines() if "=" in line)
    credential = granted["HARNESS_RUN_TOKEN"]
    assert granted["DEMO_TOKEN"] == SECRET and len(credential) > 20
    client.end(run_id)
    wait_for(
        lambda: any(
            e.get("run_id") == run_id and e["event"] == "run.ended" for e in log_entries(ops_worker)
        )
    )
    full = ops_worker.logs()
    assert f'"run_id": "{run_id}"' in full and '"level": "debug"' in full  # the log covers it
    assert SECRET not in full
    assert credential not in full


@pytest.fixture
def root_logging() -> Iterator[None]:
    """logs.configure() takes over the root logger: give it back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_log_lines_inside_a_turn_mask_its_secrets_and_carry_its_context(
    root_logging: None,
) -> None:
    stream = _Stream()
    logs.configure("json", logging.DEBUG, stream)  # type: ignore[arg-type]
    log = logging.getLogger("tests.operators")
    with logs.context(run_id="r1", turn=3):
        logs.bind(harness="codex")
        logs.mask({"OPENAI_API_KEY": "sk-live-abcdef123456"})
        log.warning("sandbox.oops", extra={"error": 'bad key "sk-live-abcdef123456"'})
    log.info("outside", extra={"n": 1})
    first, second = (json.loads(line) for line in stream.text.splitlines())
    assert first["event"] == "sandbox.oops"
    assert (first["run_id"], first["turn"], first["harness"]) == ("r1", 3, "codex")
    assert first["error"] == 'bad key "[masked]"'
    assert "sk-live" not in stream.text
    assert "run_id" not in second and second["n"] == 1


def test_text_log_format_is_key_value_for_a_terminal(root_logging: None) -> None:
    stream = _Stream()
    logs.configure("text", logging.INFO, stream)  # type: ignore[arg-type]
    with logs.context(run_id="r1", turn=1):
        logging.getLogger("t").info("turn.started", extra={"note": "two words"})
    line = stream.text.strip()
    assert re.fullmatch(
        r'\d\d:\d\d:\d\d info    turn.started  run_id=r1 turn=1 note="two words"', line
    )


class _Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, data: str) -> None:
        self.text += data

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


# -- the live CLI -----------------------------------------------------------------------------


def on_a_terminal(env: Env, *args: str, timeout: float = 60) -> tuple[int, str]:
    """Run `harness ARGS` with a pseudo-terminal as stdout and stderr; (exit status, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={**os.environ, **env.vars, "COLUMNS": "120", "TERM": "xterm-256color"},
        cwd=ROOT,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the terminal's other side closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(10), b"".join(chunks).decode("utf-8", "replace")


_CONTROL = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\r|\n|[^\x1b\r\n]+")


def final_screen(output: str) -> list[str]:
    """What a terminal shows at the end: carriage returns, erased lines and cursor-up moves
    (how the transient spinner redraws and removes itself) applied; colours dropped."""
    lines = [""]
    row = col = 0
    for match in _CONTROL.finditer(output):
        token = match.group(0)
        if token == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif token == "\r":
            col = 0
        elif match.group(2) == "A":
            row = max(0, row - int(match.group(1) or 1))
        elif match.group(2) == "K":
            lines[row] = ""  # rich erases whole lines (2K) after moving to their start
        elif not token.startswith("\x1b"):
            current = lines[row].ljust(col)
            lines[row] = current[:col] + token + current[col + len(token) :]
            col += len(token)
    return lines


@pytest.mark.redis
@pytest.mark.celery
def test_follow_on_a_terminal_streams_text_tools_spinner_and_summary(
    ops_env: Env, ops_worker: WorkerProcess
) -> None:
    script = "@text first words\n@sleep 1.5\n@activity command ls -la\n@text last words\n@usage 1200 34 0.0123"
    code, screen = on_a_terminal(
        ops_env, "run", "stdio-json", script, "--executable", DEMO, "--follow"
    )
    assert code == 0, screen
    assert ANSI.search(screen)  # colour on a terminal
    assert "thinking…" in ANSI.sub("", screen)  # the spinner, while the harness slept
    lines = [line for line in final_screen(screen) if line.strip()]
    assert re.fullmatch(r"r[0-9a-f]{24}", lines[0])
    assert lines.index("first words") < lines.index("  $ ls -la") < lines.index("last words")
    done = lines.index("✓ turn 1 complete")
    facts = lines[done + 1].strip().split(" · ")
    assert re.fullmatch(r"\d+\.\ds", facts[0])
    assert facts[1:4] == ["tokens 1200 in / 34 out", "$0.0123", "model demo-1"]
    assert re.fullmatch(r"session demo-[0-9a-f]+", facts[4])
    assert re.match(r"run r[0-9a-f]{24} · idle · 1 turn · ", lines[-1])


@pytest.mark.redis
@pytest.mark.celery
def test_follow_json_on_a_terminal_is_still_only_json_lines(
    ops_env: Env, ops_worker: WorkerProcess
) -> None:
    code, screen = on_a_terminal(
        ops_env,
        "run",
        "stdio-json",
        "@text a\n@sleep 1\n@error no",
        "--executable",
        DEMO,
        "--follow",
        "--json",
    )
    assert code == 1
    assert "\x1b" not in screen
    objects = [json.loads(line) for line in screen.replace("\r", "").splitlines()]
    assert set(objects[0]) == {"run_id", "turn"}
    assert [o["type"] for o in objects[1:]][-1] == "session-error"


# -- doctor -----------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.celery
def test_doctor_on_a_working_deployment_exits_zero_and_sees_the_worker(
    ops_env: Env, ops_worker: WorkerProcess
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "doctor", "--json"],
        capture_output=True,
        timeout=120,
        env={**os.environ, **ops_env.vars},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["redis"]["ok"] and checks["broker"]["ok"]
    assert ops_env.settings().host_queue in checks["workers"]["detail"]
    # The test deployment is deliberately permissive: doctor says so, without failing.
    assert checks["setting HARNESS_SANDBOX"]["level"] == "warn"
    assert checks["setting HARNESS_ALLOWED_EXECUTABLES"]["level"] == "warn"
    assert report["capabilities"]["stdio-json"]["session_resume"] is True


@pytest.mark.docker
def test_doctor_reads_cli_versions_inside_the_image_and_flags_a_stale_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_docker()
    settings = make_env(tmp_path, "redis://127.0.0.1:6379/0", HARNESS_SANDBOX="docker").settings()
    from sandbox.docker.sandbox import DockerSandbox

    if not DockerSandbox(tmp_path).image_exists("harness-worker/clis:1"):
        require(False, "harness-worker/clis:1 is not built (scripts/build-images)")
    pins = json.loads((ROOT / "docker" / "clis" / "package.json").read_text())
    pins["dependencies"]["@openai/codex"] = "0.0.1"
    stale = tmp_path / "package.json"
    stale.write_text(json.dumps(pins))
    monkeypatch.setattr(doctor, "PINS_FILE", stale)
    checks = {c.name: c for c in doctor.collect(settings)}
    claude = checks["cli claude-code"]
    assert claude.level == "ok"
    assert (
        claude.detail
        == f"claude {pins['dependencies']['@anthropic-ai/claude-code']} in harness-worker/clis:1"
    )
    codex = checks["cli codex"]
    assert codex.level == "warn" and "pins 0.0.1" in codex.detail and "build-images" in codex.fix


@pytest.mark.docker
def test_doctor_fails_on_a_missing_image_with_the_build_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_docker()
    settings = make_env(
        tmp_path,
        "redis://127.0.0.1:6379/0",
        HARNESS_SANDBOX="docker",
        HARNESS_IMAGES="stdio-json=harness-worker/absent:0",
    ).settings()
    code = doctor.run_doctor(json_output=True, check=lambda: doctor.collect(settings))
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert code == 1
    missing = checks["image harness-worker/absent:0"]
    assert missing["level"] == "fail" and missing["detail"] == "missing (used by stdio-json)"
    assert "scripts/build-images" in missing["fix"]


def probe_containers(scope: str) -> list[str]:
    """The probe containers of one deployment (its key prefix): another file's doctor, run on
    the other xdist worker at the same moment, has probes of its own."""
    done = subprocess.run(
        [
            *("docker", "ps", "-aq"),
            *("--filter", f"label={doctor.LABEL_DOCTOR_PROBE}=true"),
            *("--filter", f"label={LABEL_SCOPE}={scope}"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.split()


@pytest.mark.docker
def test_doctor_starts_a_probe_container_on_the_default_network_and_removes_it(
    tmp_path: Path,
) -> None:
    require_docker()
    ensure_images(["demo"])
    settings = make_env(tmp_path, "redis://127.0.0.1:6379/0", HARNESS_SANDBOX="docker").settings()
    assert settings.network == "bridge"
    before = probe_containers(settings.key_prefix)
    checks = {c.name: c for c in doctor.collect(settings)}
    probe = checks["network bridge"]
    assert probe.level == "ok", probe
    assert probe.detail == "a probe container from harness-worker/demo:1 started on it and exited 0"
    assert probe_containers(settings.key_prefix) == before


@pytest.mark.docker
def test_doctor_probe_on_a_network_the_daemon_lacks_fails_with_dockers_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # HARNESS_NETWORK only takes none, bridge or host; the probe itself takes any name.
    require_docker()
    ensure_images(["demo"])
    settings = make_env(tmp_path, "redis://127.0.0.1:6379/0", HARNESS_SANDBOX="docker").settings()
    network = f"harness-absent-{uuid.uuid4().hex[:8]}"
    before = probe_containers(settings.key_prefix)
    check = doctor.network_probe(settings, "harness-worker/demo:1", network)
    assert check.level == "fail" and check.name == f"network {network}"
    assert check.detail.endswith(f"network {network} not found"), check.detail
    assert f"docker network create {network}" in check.fix
    code = doctor.run_doctor(check=lambda: [check])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1 and lines[0].startswith(f"✗ network {network}")
    assert lines[1].strip().startswith("→ create it")
    assert probe_containers(settings.key_prefix) == before


@pytest.mark.docker
def test_doctor_probe_from_a_missing_image_fails_with_the_build_command(tmp_path: Path) -> None:
    require_docker()
    settings = make_env(tmp_path, "redis://127.0.0.1:6379/0", HARNESS_SANDBOX="docker").settings()
    check = doctor.network_probe(settings, "harness-worker/absent:0")
    assert check.level == "fail"
    assert check.detail.endswith("No such image: harness-worker/absent:0"), check.detail
    assert "scripts/build-images" in check.fix


@pytest.mark.redis
@pytest.mark.docker
def test_a_probe_container_left_by_a_killed_doctor_is_removed_by_the_reaper(
    tmp_path: Path, redis_url: str
) -> None:
    import docker as docker_sdk
    import redis

    from sandbox.docker.sandbox import DockerSandbox
    from worker.fleet.lifecycle import ReapReport, reap_sandboxes
    from worker.store.keys import Keys
    from worker.store.records import RunStore

    require_docker()
    ensure_images(["demo"])
    settings = make_env(tmp_path, redis_url, HARNESS_SANDBOX="docker").settings()
    run_id = f"{doctor.PROBE_RUN_PREFIX}{uuid.uuid4().hex[:12]}"
    name = f"harness-run-{run_id}"
    client = docker_sdk.from_env()
    try:
        # What a doctor killed between create and remove leaves behind.
        client.containers.create(
            "harness-worker/demo:1",
            ["true"],
            **doctor._probe_args(settings, run_id, name, settings.network),
        )
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        keys = Keys(settings.key_prefix)
        deps: Any = SimpleNamespace(redis=r, keys=keys, store=RunStore(r, keys, 60))
        report = ReapReport()
        reap_sandboxes(deps, DockerSandbox(tmp_path / "docker", scope=settings.key_prefix), report)
        assert report.sandboxes == [run_id]
        assert not client.containers.list(all=True, filters={"name": name})
    finally:
        with contextlib.suppress(docker_sdk.errors.NotFound):
            client.api.remove_container(name, force=True)
        client.close()


# -- deployment files -------------------------------------------------------------------------


def compose_command() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def service_blocks(text: str) -> dict[str, str]:
    """The text of each service in a compose file (block style, two-space indentation)."""
    blocks: dict[str, list[str]] = {}
    current: str | None = None
    in_services = False
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            in_services = line.rstrip() == "services:"
            current = None
            continue
        match = re.match(r"^  ([A-Za-z0-9_.-]+):\s*$", line)
        if in_services and match:
            current = match.group(1)
            blocks[current] = []
        elif in_services and current and not line.lstrip().startswith("#"):
            blocks[current].append(line)
    return {name: "\n".join(lines) for name, lines in blocks.items()}


def test_compose_gives_the_docker_socket_to_workers_only() -> None:
    blocks = service_blocks((ROOT / "compose.yaml").read_text())
    assert set(blocks) == {"redis", "worker", "beat", "flower"}
    holders = {name for name, block in blocks.items() if "docker.sock" in block}
    assert holders == {"worker"}
    worker = blocks["worker"]
    assert "/var/lib/harness-worker:/var/lib/harness-worker" in worker  # same path as the host
    assert "stop_grace_period" in worker
    for name in ("worker", "beat", "flower"):
        assert "*harness-env" in blocks[name]
        assert "harness-worker/worker:1" in blocks[name]
    assert "127.0.0.1:5555:5555" in blocks["flower"]


def test_compose_file_is_valid_for_docker_compose() -> None:
    command = compose_command()
    require(command is not None, "neither `docker compose` nor docker-compose is installed")
    assert command is not None
    base = [*command, "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml")]
    checked = subprocess.run([*base, "config", "-q"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    services = subprocess.run(
        [*base, "config", "--services"], capture_output=True, text=True, timeout=60, check=True
    )
    assert set(services.stdout.split()) == {"redis", "worker", "beat", "flower"}
    # What compose resolved (anchors and merges expanded) still mounts the socket once.
    resolved = subprocess.run(
        [*base, "config"], capture_output=True, text=True, timeout=60, check=True
    )
    blocks = service_blocks(resolved.stdout)
    assert {name for name, block in blocks.items() if "docker.sock" in block} == {"worker"}
    assert "HARNESS_REDIS_URL: redis://redis:6379/0" in blocks["flower"]


def test_worker_dockerfile_installs_the_package_and_starts_a_worker() -> None:
    text = (ROOT / "docker" / "worker.Dockerfile").read_text()
    instructions = [
        line.split()[0]
        for line in text.splitlines()
        if line and not line[0].isspace() and not line.startswith("#")
    ]
    assert instructions[:2] == ["ARG", "FROM"]
    assert instructions[-1] == "CMD"
    cmd = json.loads(text.splitlines()[-1].removeprefix("CMD "))
    assert cmd[:4] == ["celery", "-A", "worker.app", "worker"]
    for copied in ("adapters/", "sandbox/", "config/", "worker/", "harnesses/", "pyproject.toml"):
        assert re.search(rf"^COPY .*{re.escape(copied)}", text, re.M), copied
    # Every path it copies exists, so the build context is complete.
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


def test_capability_table_in_the_docs_matches_the_adapters() -> None:
    text = (ROOT / "docs" / "adapters.md").read_text()
    documented = text.split("<!-- capabilities:begin -->\n")[1].split("<!-- capabilities:end -->")[
        0
    ]
    assert documented == doctor.capability_table(), (
        "docs/adapters.md is out of date: paste `python -m worker.cli.doctor --capabilities` "
        "between its capabilities markers"
    )


def test_docs_link_only_to_files_that_exist() -> None:
    for page in ("operations.md", "adapters.md", "events.md"):
        text = (ROOT / "docs" / page).read_text()
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if target.startswith("http") or target in ("security.md", "performance.md"):
                continue  # written by others, linked ahead of them
            assert (ROOT / "docs" / target).resolve().exists(), f"{page} links to {target}"
