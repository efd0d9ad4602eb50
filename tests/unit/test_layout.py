"""The layout is the architecture: what ``adapters`` and ``sandbox`` may import (STYLE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADAPTER_FILES = sorted((ROOT / "adapters").rglob("*.py"))
SANDBOX_FILES = sorted((ROOT / "sandbox").rglob("*.py"))

# Neither package knows Celery, Redis, our settings or the worker; neither knows the other.
FORBIDDEN_ADAPTERS = {"celery", "kombu", "redis", "config", "worker", "sandbox"}
FORBIDDEN_SANDBOX = {"celery", "kombu", "redis", "config", "worker", "adapters"}
# Adapters are pure: no processes, no network, no clock.
IMPURE_MODULES = {"subprocess", "socket", "time"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, absolute, relative ones resolved against its package."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            parts = [*base, *(node.module.split(".") if node.module else [])]
            if parts:
                module = ".".join(parts)
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
            else:  # "from .. import x" at the top: x is a module
                found.update(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _top_levels(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules if m}


def test_packages_have_modules_to_check() -> None:
    assert ROOT / "adapters" / "stream.py" in ADAPTER_FILES
    assert ROOT / "sandbox" / "local.py" in SANDBOX_FILES


@pytest.mark.parametrize("path", ADAPTER_FILES, ids=_rel)
def test_adapters_import_no_infrastructure_nor_sandbox(path: Path) -> None:
    bad = _top_levels(_imports(path)) & FORBIDDEN_ADAPTERS
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: adapters stay pure (STYLE.md)"


@pytest.mark.parametrize("path", SANDBOX_FILES, ids=_rel)
def test_sandbox_imports_no_infrastructure_nor_adapters(path: Path) -> None:
    bad = _top_levels(_imports(path)) & FORBIDDEN_SANDBOX
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: the worker passes values down"


@pytest.mark.parametrize("path", ADAPTER_FILES, ids=_rel)
def test_adapters_import_no_process_network_or_clock(path: Path) -> None:
    bad = _top_levels(_imports(path)) & IMPURE_MODULES
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: adapters do no I/O and read no clock"


@pytest.mark.parametrize("path", ADAPTER_FILES, ids=_rel)
def test_adapters_read_no_environment_nor_files(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "environb", "getenv"}:
            problems.append(f"line {node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {alias.name for alias in node.names} & {"environ", "environb", "getenv"}
            problems.extend(f"line {node.lineno}: from os import {name}" for name in names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "open":
                problems.append(f"line {node.lineno}: open()")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            io = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir"}
            if node.func.attr in io:
                problems.append(f"line {node.lineno}: .{node.func.attr}()")
    assert not problems, f"{_rel(path)} touches the environment or filesystem: {problems}"


def test_import_check_sees_relative_and_dynamic_imports(tmp_path: Path) -> None:
    package = tmp_path / "adapters"
    package.mkdir()
    probe = package / "probe.py"
    probe.write_text(
        "import importlib\n"
        "from .. import worker\n"
        "from . import stream\n"
        "import redis.client\n"
        "importlib.import_module('celery')\n"
    )
    tops = _top_levels(_imports(probe, root=tmp_path))
    assert tops == {"importlib", "worker", "adapters", "redis", "celery"}


# The producer's client: the record, the stream and the queues, never the turn loop, the
# lifecycle, the worker's runtime or Docker; and importing it changes nothing in the process.
CLIENT_MUST_NOT_LOAD = (
    "worker.turn.execute",
    "worker.turn.attempt",
    "worker.fleet.lifecycle",
    "worker.runtime",
    "worker.tasks",
    "worker.fleet.host_queues",
    "adapters.stream",
    "sandbox.docker.sandbox",
    "docker",
)


def test_importing_the_client_loads_no_worker_runtime_and_patches_nothing() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, kombu.transport\n"
        "before = dict(kombu.transport.TRANSPORT_ALIASES)\n"
        "import worker.client\n"
        f"print(sorted(m for m in {CLIENT_MUST_NOT_LOAD!r} if m in sys.modules))\n"
        "print(before == kombu.transport.TRANSPORT_ALIASES)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded, unpatched = done.stdout.splitlines()
    assert loaded == "[]"
    assert unpatched == "True"


def test_the_worker_app_patches_the_broker_transport_when_built() -> None:
    import subprocess
    import sys

    probe = (
        "import kombu.transport\n"
        "from worker.app import app\n"
        "print(kombu.transport.TRANSPORT_ALIASES['redis'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "worker.broker:Transport"
