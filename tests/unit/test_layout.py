"""The layout is the architecture: what each package of ``adapters`` and ``sandbox`` may
import, that every module there says what it is, that the sandbox's errors and labels each
have one home."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
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
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: adapters stay pure"


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


@dataclass(frozen=True)
class Rule:
    """What the modules of one package may import besides the standard library: modules of
    ours (a name and everything under it) and third-party distributions (top-level names)."""

    ours: frozenset[str]
    third_party: frozenset[str] = frozenset()


BACKEND = frozenset(
    {
        "sandbox.base",
        "sandbox.chunks",
        "sandbox.pipes",
        "sandbox.procs",
        "sandbox.small_files",
        "sandbox.stdin_pipe",
        "sandbox.threads",
        "sandbox.workspace",
        "sandbox.store",
    }
)
# The most specific entry (by path) is a module's rule.
RULES: dict[str, Rule] = {
    # Pure mappers: each other, pydantic (the event models) and orjson (the stream driver).
    "adapters": Rule(frozenset({"adapters"}), frozenset({"pydantic", "pydantic_core", "orjson"})),
    # The boundary knows nothing but itself.
    "sandbox/base.py": Rule(frozenset()),
    # What a run may reach: policy shared by the worker and the backends, pure.
    "sandbox/network.py": Rule(frozenset()),
    # Which addresses are public: one rule for the store's seeds, the backends and the API.
    "sandbox/addresses.py": Rule(frozenset({"sandbox.base"})),
    # Small shared helpers of the backends (the lowest, small_files and threads, import none
    # of ours).
    "sandbox": Rule(frozenset({"sandbox.base", "sandbox.small_files", "sandbox.threads"})),
    # The daemon's ID names the host's queue (HARNESS_HOST_QUEUE otherwise).
    "sandbox/identity.py": Rule(frozenset({"sandbox.base"}), frozenset({"docker", "requests"})),
    # A backend: the boundary, the shared helpers and the store; never the other backend.
    "sandbox/local.py": Rule(BACKEND),
    "sandbox/docker": Rule(
        BACKEND | {"sandbox.docker", "sandbox.network", "sandbox.addresses"},
        frozenset({"docker", "requests"}),
    ),
    # The workspace store knows no backend.
    "sandbox/store": Rule(
        frozenset(
            {
                "sandbox.base",
                "sandbox.small_files",
                "sandbox.workspace",
                "sandbox.store",
                "sandbox.addresses",
            }
        )
    ),
}
FIRST_PARTY = {"adapters", "sandbox", "worker", "config", "tests"}


def _rule(path: Path) -> Rule:
    rel = _rel(path)
    matches = [key for key in RULES if rel == key or rel.startswith(key + "/")]
    return RULES[max(matches, key=len)]


def _not_allowed(modules: set[str], rule: Rule) -> set[str]:
    bad = set()
    for module in modules:
        top = module.split(".")[0]
        if top in sys.stdlib_module_names:
            continue
        if top not in FIRST_PARTY:
            if top not in rule.third_party:
                bad.add(top)
            continue
        if not any(module == ok or module.startswith(ok + ".") for ok in rule.ours):
            bad.add(module)
    return bad


@pytest.mark.parametrize("path", ADAPTER_FILES + SANDBOX_FILES, ids=_rel)
def test_each_package_imports_only_what_its_rule_allows(path: Path) -> None:
    bad = _not_allowed(_imports(path), _rule(path))
    assert not bad, f"{_rel(path)} imports {sorted(bad)}, outside its rule in RULES"


def test_the_rules_refuse_a_backend_in_the_store_and_docker_in_the_local_backend() -> None:
    store, local = RULES["sandbox/store"], RULES["sandbox/local.py"]
    assert _not_allowed({"sandbox.docker.container", "sandbox.local"}, store) == {
        "sandbox.docker.container",
        "sandbox.local",
    }
    assert _not_allowed({"sandbox.docker.sandbox", "docker"}, local) == {
        "sandbox.docker.sandbox",
        "docker",
    }
    assert _not_allowed({"redis", "worker.app", "sandbox.base"}, RULES["adapters"]) == {
        "redis",
        "worker.app",
        "sandbox.base",
    }
    assert _rule(ROOT / "sandbox" / "store" / "seeding.py") is store
    assert _rule(ROOT / "sandbox" / "docker" / "egress.py") is RULES["sandbox/docker"]


@pytest.mark.parametrize("path", ADAPTER_FILES + SANDBOX_FILES, ids=_rel)
def test_every_module_says_what_it_is(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    assert ast.get_docstring(tree), f"{_rel(path)} has no module docstring"


# Exceptions of ours that never leave the module that raises them: the Docker backend's exec
# seam translates DaemonRefused; a private class (a leading underscore) is caught inside.
INTERNAL_EXCEPTIONS = {"sandbox.docker.stream.DaemonRefused"}


def _modules(files: list[Path]) -> list[str]:
    names = [".".join(f.relative_to(ROOT).with_suffix("").parts) for f in files]
    return [name.removesuffix(".__init__") for name in names]


@pytest.mark.parametrize("module", _modules(SANDBOX_FILES))
def test_the_sandbox_error_tree_is_defined_in_base_alone(module: str) -> None:
    import importlib

    from sandbox.base import SandboxError

    loaded = importlib.import_module(module)
    for name, value in vars(loaded).items():
        if not isinstance(value, type) or not issubclass(value, BaseException):
            continue
        if value.__module__ != module or name.startswith("_"):
            continue  # imported from elsewhere, or private
        if module == "sandbox.base":
            assert issubclass(value, SandboxError), f"{name} is outside the SandboxError tree"
            continue
        assert f"{module}.{name}" in INTERNAL_EXCEPTIONS, (
            f"{module}.{name}: the sandbox's errors are defined in sandbox/base.py"
        )


def _sandbox_labels() -> dict[str, str]:
    """Every label constant of the sandbox (``LABEL_*``, ``*_LABEL``): value → where."""
    found: dict[str, str] = {}
    for path in SANDBOX_FILES:
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and ("LABEL_" in node.targets[0].id or node.targets[0].id.endswith("_LABEL"))
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                where = f"{_rel(path)}:{node.targets[0].id}"
                assert node.value.value not in found, f"{where} repeats {found[node.value.value]}"
                found[node.value.value] = where
    return found


def test_container_labels_are_defined_once_and_the_worker_spells_none() -> None:
    labels = _sandbox_labels()
    assert labels["harness.lease_until"] == "sandbox/base.py:LABEL_LEASE"
    spelled = [
        f"{_rel(path)}:{node.lineno} {node.value!r} (use {labels[node.value]})"
        for path in sorted((ROOT / "worker").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in labels
    ]
    assert not spelled, f"label literals in the worker: {spelled}"


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


# Inside worker/: each room imports only the rooms below it (and the standard ones above the
# worker: adapters, sandbox, config). A room is a subpackage or a top-level module.
WORKER_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),  # the errors producers see
    frozenset({"options"}),  # what a producer may ask for, and the operator's policy on it
    frozenset({"observe"}),  # logs, metrics, masking
    frozenset({"store"}),  # Redis: keys, records, status, scripts, streams, the terminal
    frozenset({"deps"}),  # what a turn needs from its worker process
    frozenset({"permissions", "spend", "workspace"}),  # a turn's policies and its workspace
    frozenset({"tools"}),  # the run's MCP endpoint and what stands behind it
    frozenset({"gateway"}),  # the model gateway: a turn's model requests, the keys kept out
    frozenset({"control"}),  # a person's messages to a run, and the attempts of one seed
    frozenset({"outcomes"}),  # a run graded against its rubric after each turn
    frozenset({"triggers"}),  # a forge's or webhook sender's events: verified, filtered, mapped
    frozenset({"turn"}),  # one turn, from its claim to its end
    frozenset({"schedules"}),  # runs started on a cron, fired by the workers' reaper timer
    frozenset({"fleet"}),  # hosts, host queues, the reaper, the end of a run
    frozenset({"app_names", "broker"}),  # the Celery layer: task names, the broker transport,
    frozenset({"app"}),  # the app,
    frozenset({"runtime"}),  # a worker process's dependencies,
    frozenset({"tasks"}),  # the tasks
    frozenset({"client"}),  # the producer's Python API
    frozenset({"api"}),  # the HTTP API
    frozenset({"cli"}),  # the command line (which also serves the API)
)
CELERY_ROOMS = frozenset({"app", "broker", "runtime", "tasks", "client", "cli"})
"""The rooms that may import celery or kombu (the Celery layer and the producers)."""


BACKEND_COMPOSER = ROOT / "worker" / "runtime.py"
"""The one module of the worker that names a sandbox backend's own modules (it builds the
backend); every other one goes through the boundary (``sandbox.base``, ``sandbox.network``,
``sandbox.workspace``, the store)."""
BACKEND_MODULES = ("sandbox.docker", "sandbox.local")


def _backend_imports(path: Path) -> list[str]:
    return sorted(
        m for m in _imports(path) if any(m == b or m.startswith(b + ".") for b in BACKEND_MODULES)
    )


@pytest.mark.parametrize("path", sorted((ROOT / "worker").rglob("*.py")), ids=_rel)
def test_the_worker_names_a_backend_only_where_it_builds_one(path: Path) -> None:
    if path == BACKEND_COMPOSER:
        assert _backend_imports(path), "worker/runtime.py builds the backends: it imports them"
        return
    bad = _backend_imports(path)
    assert not bad, f"{_rel(path)} imports {bad}: only {_rel(BACKEND_COMPOSER)} may"


def test_the_backend_check_sees_a_lazy_import_of_the_docker_backend(tmp_path: Path) -> None:
    probe = tmp_path / "worker" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "def f():\n    from sandbox.docker.container import parse_user\n"
        "    from sandbox.network import egress_labels\n"
    )
    found = sorted(m for m in _imports(probe, root=tmp_path) if m.startswith("sandbox"))
    assert [m for m in found if m.startswith("sandbox.docker")] == [
        "sandbox.docker.container",
        "sandbox.docker.container.parse_user",
    ]


def _room(path: Path) -> str:
    parts = path.relative_to(ROOT / "worker").with_suffix("").parts
    return parts[0]


def _layer(room: str) -> int:
    for level, rooms in enumerate(WORKER_LAYERS):
        if room in rooms:
            return level
    raise AssertionError(f"worker/{room} is in no layer of WORKER_LAYERS: add it")


WORKER_FILES = sorted(p for p in (ROOT / "worker").rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", WORKER_FILES, ids=_rel)
def test_each_worker_room_imports_only_the_rooms_below_it(path: Path) -> None:
    room = _room(path)
    level = _layer(room)
    imported = {module.split(".")[1] for module in _imports(path) if module.startswith("worker.")}
    upward = sorted(
        other for other in imported - {room} if other != "__init__" and _layer(other) >= level
    )
    assert not upward, f"{_rel(path)} (worker/{room}) imports {upward}: arrows only downward"
    if room not in CELERY_ROOMS:
        bad = _top_levels(_imports(path)) & {"celery", "kombu"}
        assert not bad, f"{_rel(path)} imports {sorted(bad)}: only the Celery layer does"
