"""`harness doctor`: every problem found with its fix, exit 1 when something is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config import load_settings
from worker.cli import doctor
from worker.cli.doctor import Check, collect, mask_url, run_doctor, settings_checks

CLOSED = "redis://:sekrit-pw@127.0.0.1:1/0"
NO_DAEMON = "unix:///nonexistent/docker.sock"
GIB = 1024**3


def settings(tmp_path: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "redis_url": CLOSED,
        "broker_url": CLOSED,
        "docker_url": NO_DAEMON,
        "workspace_root": str(tmp_path),
    }
    values.update(overrides)
    return load_settings(**values)


def doctor_json(capsys: pytest.CaptureFixture[str], checks: list[Check]) -> tuple[int, Any]:
    code = run_doctor(json_output=True, check=lambda: checks)
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1  # one object, nothing else
    return code, json.loads(out)


def test_nothing_reachable_fails_with_a_fix_for_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = doctor_json(capsys, collect(settings(tmp_path)))
    assert code == 1 and report["ok"] is False
    failed = {c["name"]: c for c in report["checks"] if c["level"] == "fail"}
    assert {"redis", "broker", "docker"} <= set(failed)
    for check in failed.values():
        assert check["ok"] is False
        assert check["fix"] and "\n" not in check["fix"]
    assert "HARNESS_REDIS_URL" in failed["redis"]["fix"]
    assert "dockerd" in failed["docker"]["fix"]


def test_passwords_never_appear_in_either_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checks = collect(settings(tmp_path, broker_url="amqp://guest:sekrit-pw@127.0.0.1:1//"))
    run_doctor(json_output=True, check=lambda: checks)
    run_doctor(json_output=False, check=lambda: checks)
    out = capsys.readouterr().out
    assert "sekrit-pw" not in out
    assert "redis://:***@127.0.0.1:1/0" in out


def test_human_output_marks_failures_and_gives_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_doctor(check=lambda: collect(settings(tmp_path)))
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    redis_at = next(i for i, line in enumerate(lines) if line.startswith("✗ redis"))
    assert lines[redis_at + 1].strip().startswith("→ start Redis")
    assert lines[-1].startswith("3 failed")


def test_warnings_alone_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    checks = [Check("redis", True, "ok"), doctor.warn("setting X", "odd", "change it")]
    code, report = doctor_json(capsys, checks)
    assert code == 0 and report["ok"] is True
    assert [c["level"] for c in report["checks"]] == ["ok", "warn"]


def test_capabilities_of_every_harness_are_in_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = doctor_json(capsys, [Check("redis", True, "ok")])
    assert set(report["capabilities"]) == {
        "claude-code",
        "codex",
        "gemini",
        "opencode",
        "pi",
        "stdio-json",
    }
    assert report["capabilities"]["stdio-json"]["permission_policy"] == "none"


def test_local_sandbox_does_not_need_docker(tmp_path: Path) -> None:
    (docker,) = [c for c in collect(settings(tmp_path, sandbox="local")) if c.name == "docker"]
    assert docker.ok and docker.detail.startswith("not used")


def test_docker_backend_needs_docker(tmp_path: Path) -> None:
    (docker,) = [c for c in collect(settings(tmp_path)) if c.name == "docker"]
    assert not docker.ok and docker.level == "fail"


def levels(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.level for c in checks}


def test_default_settings_look_fine(tmp_path: Path) -> None:
    checks = settings_checks(
        settings(
            tmp_path, redis_url="redis://127.0.0.1:6379/0", broker_url="redis://127.0.0.1:6379/0"
        ),
        64 * GIB,
    )
    assert levels(checks) == {"settings": "ok"}


def test_visibility_timeout_shorter_than_a_turn_fails(tmp_path: Path) -> None:
    checks = settings_checks(settings(tmp_path, visibility_timeout_s=600), 64 * GIB)
    assert levels(checks)["setting HARNESS_VISIBILITY_TIMEOUT_S"] == "fail"
    assert not all(c.ok for c in checks)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"allowed_networks": "none,bridge,host"}, "setting HARNESS_ALLOWED_NETWORKS"),
        ({"allowed_executables": "*"}, "setting HARNESS_ALLOWED_EXECUTABLES"),
        ({"allowed_images": "*"}, "setting HARNESS_ALLOWED_IMAGES"),
        ({"sandbox": "local"}, "setting HARNESS_SANDBOX"),
        ({"allowed_sandboxes": "local"}, "setting HARNESS_ALLOWED_SANDBOXES"),
        ({"container_user": "0:0"}, "setting HARNESS_CONTAINER_USER"),
        ({"read_only_root": False}, "setting HARNESS_READ_ONLY_ROOT"),
        ({"idle_timeout_s": 1800}, "setting HARNESS_IDLE_TIMEOUT_S"),
        ({"pool": "prefork"}, "setting HARNESS_POOL"),
        ({"redis_url": "redis://10.0.0.5:6379/0"}, "setting HARNESS_REDIS_URL"),
        ({"broker_url": "amqp://10.0.0.5:5672//"}, "setting HARNESS_BROKER_URL"),
        ({"docker_url": "tcp://10.0.0.5:2375"}, "setting HARNESS_DOCKER_URL"),
        ({"memory": "16g"}, "setting HARNESS_MEMORY"),
    ],
)
def test_risky_setting_is_a_warning_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], name: str
) -> None:
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    base = {"redis_url": "redis://127.0.0.1:6379/0", "broker_url": "redis://127.0.0.1:6379/0"}
    checks = settings_checks(settings(tmp_path, **{**base, **overrides}), 8 * GIB)
    found = [c for c in checks if c.name == name]
    assert found, levels(checks)
    assert found[0].level == "warn" and found[0].ok and found[0].fix


def test_remote_redis_with_a_password_is_not_flagged(tmp_path: Path) -> None:
    checks = settings_checks(
        settings(
            tmp_path,
            redis_url="rediss://:pw@redis.internal:6380/0",
            broker_url="redis://127.0.0.1:6379/0",
        ),
        64 * GIB,
    )
    assert "setting HARNESS_REDIS_URL" not in levels(checks)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_mask_url_hides_only_the_password(url: str, masked: str) -> None:
    assert mask_url(url) == masked


# -- the network probe ------------------------------------------------------------------------


class FakeContainer:
    def __init__(self, client: FakeDocker, name: str) -> None:
        self.client, self.name = client, name

    def start(self) -> None:
        self.client.step("start", self.name)

    def wait(self, timeout: float) -> dict[str, Any]:
        self.client.step("wait", self.name)
        return {"StatusCode": self.client.exit_code, "Error": None}

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return b"sh: 1: true: not found\n"


class FakeDocker:
    """The part of the Docker SDK client the probe uses; ``fail`` maps a step to its error."""

    def __init__(
        self, fail: dict[str, list[BaseException]] | None = None, exit_code: int = 0
    ) -> None:
        self.fail = fail or {}
        self.exit_code = exit_code
        self.created: list[tuple[str, list[str], dict[str, Any]]] = []
        self.removed: list[str] = []
        self.closed = False
        self.containers = self
        self.api = self

    def step(self, name: str, container: str) -> None:
        errors = self.fail.get(name)
        if errors:
            raise errors.pop(0)

    def create(self, image: str, command: list[str], **args: Any) -> FakeContainer:
        self.created.append((image, command, args))
        self.step("create", args["name"])
        return FakeContainer(self, args["name"])

    def remove_container(self, name: str, force: bool) -> None:
        assert force
        self.removed.append(name)
        self.step("remove", name)

    def close(self) -> None:
        self.closed = True


def api_error(text: str, cls: type[Exception] | None = None) -> Exception:
    import docker.errors

    return (cls or docker.errors.APIError)(f"500 Server Error: {text}", explanation=text)


def probe(tmp_path: Path, client: FakeDocker, **overrides: Any) -> Check:
    s = settings(tmp_path, docker_url=None, **overrides)
    return doctor.network_probe(s, "harness-worker/demo:1", client=client)


def test_probe_runs_true_hardened_like_a_run_and_removes_its_container(tmp_path: Path) -> None:
    client = FakeDocker()
    check = probe(tmp_path, client, container_user="1234:2345", key_prefix="deploy1")
    assert check.level == "ok" and check.name == "network bridge"
    assert check.detail == "a probe container from harness-worker/demo:1 started on it and exited 0"
    ((image, command, args),) = client.created
    assert image == "harness-worker/demo:1" and command == ["true"] and args["entrypoint"] == []
    assert args["user"] == "1234:2345" and args["network_mode"] == "bridge"
    assert args["cap_drop"] == ["ALL"] and args["security_opt"] == ["no-new-privileges"]
    assert args["read_only"] is True and args["privileged"] is False
    assert args["tmpfs"] == {"/tmp": "rw,nosuid,nodev,uid=1234,gid=2345"}
    labels = args["labels"]
    # Labelled like a run's container without a run record: a reaper removes a leftover.
    assert labels["harness.managed"] == "true" and labels["harness.scope"] == "deploy1"
    assert labels["harness.run_id"].startswith("doctor-")
    assert labels[doctor.LABEL_DOCTOR_PROBE] == "true"
    assert args["name"] == "harness-run-" + labels["harness.run_id"]
    assert client.removed == [args["name"]] and client.closed


def test_probe_on_a_daemon_without_its_default_bridge_says_how_to_get_it_back(
    tmp_path: Path,
) -> None:
    # Docker's words when the bridge interface of the default network was deleted.
    error = (
        "failed to create endpoint harness-run-doctor-1 on network bridge: adding interface "
        "veth68eabb5 to bridge docker0 failed: could not find bridge docker0: route ip+net: "
        "no such network interface"
    )
    client = FakeDocker({"start": [api_error(error)]})
    check = probe(tmp_path, client)
    assert check.level == "fail" and not check.ok
    assert check.detail.endswith(error)
    assert (
        "docker0" in check.fix and "restart dockerd" in check.fix and "--bridge none" in check.fix
    )
    assert len(client.removed) == 1  # the created container went too


@pytest.mark.parametrize(
    ("network", "error", "in_fix"),
    [
        ("bridge", "network bridge not found", "--bridge none"),
        ("custom-net", "network custom-net not found", "docker network create custom-net"),
        ("bridge", "No such image: harness-worker/demo:1", "scripts/build-images"),
        (
            "bridge",
            "Error while fetching server API version: ('Connection aborted.', "
            "FileNotFoundError(2, 'No such file or directory'))",
            "start dockerd",
        ),
        ("bridge", "something else entirely", "docker run --rm --network bridge --user"),
    ],
)
def test_probe_failure_keeps_dockers_words_and_gives_the_fix(
    network: str, error: str, in_fix: str
) -> None:
    check = doctor.network_failure(network, "harness-worker/demo:1", "1000:1000", error)
    assert check.name == f"network {network}" and check.level == "fail"
    assert error in check.detail and in_fix in check.fix and "\n" not in check.fix


def test_probe_that_exits_non_zero_fails_with_its_output(tmp_path: Path) -> None:
    client = FakeDocker(exit_code=127)
    check = probe(tmp_path, client)
    assert check.level == "fail"
    assert "exited with 127: sh: 1: true: not found" in check.detail
    assert len(client.removed) == 1


def test_probe_removed_by_a_reaper_meanwhile_is_tried_once_more(tmp_path: Path) -> None:
    import docker.errors

    gone = api_error("No such container: abc", docker.errors.NotFound)
    client = FakeDocker({"start": [gone]})
    check = probe(tmp_path, client)
    assert check.level == "ok"
    assert len(client.created) == 2 and len(set(client.removed)) == 2


def test_probe_a_missing_image_is_not_tried_again(tmp_path: Path) -> None:
    import docker.errors

    missing = api_error("No such image: harness-worker/demo:1", docker.errors.ImageNotFound)
    client = FakeDocker({"create": [missing]})
    check = probe(tmp_path, client)
    assert check.level == "fail" and "scripts/build-images" in check.fix
    assert len(client.created) == 1 and len(client.removed) == 1


def test_probe_container_that_cannot_be_removed_is_reported(tmp_path: Path) -> None:
    client = FakeDocker({"remove": [api_error("removal already in progress")]})
    check = probe(tmp_path, client)
    assert check.level == "warn" and "removal already in progress" in check.detail
    assert check.fix.startswith("remove it: docker rm -f harness-run-doctor-")


def test_probe_prefers_the_demo_image_then_any_present_one() -> None:
    demo, clis, other = "harness-worker/demo:1", "harness-worker/clis:1", "acme/agent:2"
    assert doctor.probe_image_for({clis: True, demo: True, other: True}) == demo
    assert doctor.probe_image_for({other: False, demo: False, clis: True}) == clis
    assert doctor.probe_image_for({clis: True, demo: False, other: True}) == other  # by name
    assert doctor.probe_image_for({demo: False, clis: False}) is None


def test_no_image_to_probe_with_fails_only_when_docker_is_needed(tmp_path: Path) -> None:
    needed = doctor._network(settings(tmp_path), {"harness-worker/demo:1": False}, True)
    assert needed.level == "fail" and "scripts/build-images" in needed.fix
    spare = doctor._network(settings(tmp_path), {"harness-worker/demo:1": False}, False)
    assert spare.level == "warn" and spare.ok
