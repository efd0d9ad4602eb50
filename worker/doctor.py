"""``harness doctor``: is everything a worker needs here, and if not, how to fix it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import adapters
from config import Settings, load_settings

_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def mask_url(url: str) -> str:
    """A URL with its password replaced, safe to print."""
    return _URL_PASSWORD.sub(r"\1***@", url)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _redis(settings: Settings) -> Check:
    import redis

    try:
        redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3).ping()
        return Check("redis", True, mask_url(settings.redis_url))
    except redis.RedisError as exc:
        return Check(
            "redis",
            False,
            f"{mask_url(settings.redis_url)}: {exc}",
            "start Redis (redis-server --daemonize yes) or set HARNESS_REDIS_URL",
        )


def _broker(settings: Settings) -> Check:
    from kombu.connection import Connection

    try:
        with Connection(settings.broker_url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return Check("broker", True, mask_url(settings.broker_url))
    except Exception as exc:  # noqa: BLE001 -- kombu raises many transport-specific errors
        return Check(
            "broker",
            False,
            f"{mask_url(settings.broker_url)}: {exc}",
            "start the broker or set HARNESS_BROKER_URL",
        )


def _docker(settings: Settings) -> list[Check]:
    from sandbox.base import SandboxError

    try:
        from sandbox.docker import DockerSandbox
    except ImportError as exc:
        return [
            Check("docker", False, f"the Docker backend cannot load: {exc}", "pip install docker")
        ]
    try:
        sandbox = DockerSandbox(
            __import__("pathlib").Path(settings.workspace_root) / "docker",
            base_url=settings.docker_url,
        )
        sandbox.ping()
    except SandboxError as exc:
        return [Check("docker", False, str(exc), "start dockerd (scripts/ensure-docker)")]
    checks = [Check("docker", True, settings.docker_url or "local daemon")]
    for image in sorted(set(settings.images.values())):
        present = sandbox.image_exists(image)
        checks.append(
            Check(
                f"image {image}",
                present,
                "present" if present else "missing",
                "" if present else "build it with scripts/build-images",
            )
        )
    return checks


def collect(settings: Settings | None = None) -> list[Check]:
    settings = settings or load_settings()
    checks = [_redis(settings), _broker(settings)]
    checks += _docker(settings)
    if "host" in settings.allowed_networks or "*" in settings.allowed_networks:
        checks.append(Check("policy", True, "producers may ask for host networking"))
    return checks


def run_doctor(json_output: bool = False, check: Callable[[], list[Check]] = collect) -> int:
    checks = check()
    ok = all(c.ok for c in checks)
    if json_output:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "checks": [c.__dict__ for c in checks],
                    "capabilities": {
                        h: adapters.capabilities(h) for h in adapters.HARNESS_IDS if _importable(h)
                    },
                }
            )
        )
    else:
        for c in checks:
            mark = "ok " if c.ok else "FAIL"
            print(f"[{mark}] {c.name}: {c.detail}" + (f" -> {c.fix}" if c.fix else ""))
    return 0 if ok else 1


def _importable(harness: str) -> bool:
    try:
        adapters.get(harness)
    except ImportError:
        return False
    return True
