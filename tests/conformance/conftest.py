"""Fixtures for the live conformance suite: the real harness CLIs against the fake model server.

- ``clis`` (session): installs the pinned CLIs (``scripts/install-clis``) and returns their bin
  dir. Without npm the suite is skipped, except under ``CI=true`` where that is a failure.
- ``fake_model`` (per test, on one session-wide server): a :class:`FakeModelServer` reset to
  its defaults with an empty request log.
- ``live_placement()``: a fresh local-sandbox run (workspace + HOME inside it), torn down
  after the test. Reuse one placement across turns for resume tests.
- ``run_live_turn(harness_id, request, *, placement=None, secrets=None, timeout=120)``: one
  turn through the adapter, the local sandbox and the worker's own read loop
  (``worker.turn.attempt.drive``, the stream driver under it); returns a :class:`LiveTurn`.
- ``api_error`` (parametrised): each of the fake API's error scenarios in turn, as an
  :class:`ApiError` that says how a turn meeting it must end.

Every test under ``tests/conformance`` is marked ``conformance``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `tests.fakemodel` is imported as a package from the repo root
    sys.path.insert(0, str(REPO))
# The shared scenarios assert too: a failing check shows the values it compared.
pytest.register_assert_rewrite("tests.conformance.shared_scenarios")

import fakeredis  # noqa: E402

import adapters  # noqa: E402
from adapters.events import Event, SessionError, TurnComplete  # noqa: E402
from adapters.protocol import Command, TurnRequest  # noqa: E402
from adapters.stream import StreamDriver  # noqa: E402
from sandbox.base import Chunk, ExecSpec, Placement, Process, RunSpec  # noqa: E402
from sandbox.local import LocalSandbox  # noqa: E402
from tests.fakemodel import RETRY_AFTER_S, FakeModelServer, RecordedRequest  # noqa: E402
from tests.fakemodel.clis import FAKE_KEY  # noqa: E402
from worker.options.policy import fit_request  # noqa: E402
from worker.store.keys import Keys  # noqa: E402
from worker.store.publisher import RedisStreamPublisher  # noqa: E402
from worker.turn import attempt  # noqa: E402

#: Granted secrets a turn gets when the test passes none: the variables each CLI (or the
#: config its adapter writes) reads its API key from, all set to a fake key.
DEFAULT_SECRETS: dict[str, dict[str, str]] = {
    "claude-code": {"ANTHROPIC_API_KEY": FAKE_KEY},
    "codex": {"OPENAI_API_KEY": FAKE_KEY, "CODEX_API_KEY": FAKE_KEY},
    "gemini": {"GEMINI_API_KEY": FAKE_KEY},
    "opencode": {"OPENAI_API_KEY": FAKE_KEY},
    "pi": {"OPENAI_API_KEY": FAKE_KEY},
    "stdio-json": {},
}

#: Base URLs as docs/events.md's `--base-url` writes them: no version path for Anthropic and Gemini, ``/v1`` for
#: the OpenAI-style APIs.
VERSION_PATH: dict[str, str] = {
    "claude-code": "",
    "gemini": "",
    "codex": "/v1",
    "opencode": "/v1",
    "pi": "/v1",
    "stdio-json": "",
}

#: After the harness's terminal message it gets this long to exit before it is killed.
EXIT_GRACE_S = 5.0


def base_url_for(harness_id: str, server: FakeModelServer) -> str:
    return server.url + VERSION_PATH.get(harness_id, "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.path)).is_relative_to(here):
            item.add_marker(pytest.mark.conformance)


# --------------------------------------------------------------------------- CLIs
def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def clis() -> Path:
    """The bin dir of the pinned harness CLIs, installed once per session."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        reason = "node and npm are needed to install the harness CLIs (scripts/install-clis)"
        if _in_ci():
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    result = subprocess.run(
        [str(REPO / "scripts" / "install-clis")],
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        reason = f"scripts/install-clis failed: {result.stderr.strip()[-2000:]}"
        if _in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- fake model
@pytest.fixture(scope="session")
def fake_model_server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def fake_model(fake_model_server: FakeModelServer) -> Iterator[FakeModelServer]:
    """The session's fake model server, reset (scenario ``text``, empty log) for this test."""
    fake_model_server.reset()
    yield fake_model_server
    fake_model_server.reset()


@dataclass(frozen=True)
class ApiError:
    """One of the fake API's error scenarios and how a turn that meets it must end."""

    scenario: str
    reason: str
    retryable: bool
    retry_after_s: float | None = None
    """The delay the fake API asks the client to wait."""


API_ERRORS = (
    ApiError("http-429", "rate-limited", True, retry_after_s=RETRY_AFTER_S),
    ApiError("http-401", "auth", False),
    ApiError("quota", "quota", False),
    ApiError("http-500", "harness-error", True),
)


@pytest.fixture(params=API_ERRORS, ids=lambda error: error.scenario)
def api_error(request: pytest.FixtureRequest) -> ApiError:
    """Each of the fake API's error scenarios in turn (a test using it runs once for each)."""
    error: ApiError = request.param
    return error


# --------------------------------------------------------------------------- live turns
@dataclass
class LiveTurn:
    """What one live turn produced."""

    harness: str
    request: TurnRequest
    command: Command
    argv: tuple[str, ...]
    """The argv really started (argv[0] resolved to the installed CLI)."""
    placement: Placement
    events: list[Event]
    driver: StreamDriver
    exit_code: int | None
    stdout: bytes
    stderr: str
    requests: list[RecordedRequest]
    """The fake model server's log entries made during this turn."""
    timed_out: bool
    duration_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> Any:
        return self.driver.state

    @property
    def terminal(self) -> Event | None:
        """The terminal event as the worker publishes it (``exit_code`` filled in)."""
        return self.events[-1] if self.events and self.events[-1].terminal else None

    @property
    def complete(self) -> TurnComplete:
        """The terminal ``turn-complete``; fails the test with the details otherwise."""
        if not isinstance(self.terminal, TurnComplete):
            raise AssertionError(f"turn did not complete: {self.describe()}")
        return self.terminal

    @property
    def error(self) -> SessionError:
        if not isinstance(self.terminal, SessionError):
            raise AssertionError(f"turn did not fail: {self.describe()}")
        return self.terminal

    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def of_type(self, event_type: str) -> list[Event]:
        return [event for event in self.events if event.type == event_type]

    def model_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.kind == "turn"]

    def describe(self) -> str:
        return (
            f"{self.harness} exit={self.exit_code} timed_out={self.timed_out} "
            f"terminal={self.terminal!r}\nargv={list(self.argv)}\n"
            f"stdout tail={self.stdout[-3000:].decode('utf-8', 'replace')}\n"
            f"stderr tail={self.stderr[-2000:]}\n"
            f"requests={[(r.path, r.scenario, r.status) for r in self.requests]}"
        )


@pytest.fixture(scope="session")
def live_sandbox(tmp_path_factory: pytest.TempPathFactory) -> LocalSandbox:
    return LocalSandbox(tmp_path_factory.mktemp("live-sandbox"))


@pytest.fixture
def live_placement(live_sandbox: LocalSandbox) -> Iterator[Callable[[], Placement]]:
    """Factory: a fresh local-sandbox run; every run made is torn down after the test."""
    made: list[str] = []

    def make() -> Placement:
        run_id = f"live-{uuid.uuid4().hex[:12]}"
        made.append(run_id)
        return live_sandbox.prepare(RunSpec(run_id=run_id, network="host"))

    yield make
    for run_id in made:
        live_sandbox.teardown(run_id)


def _resolve(argv: tuple[str, ...], bin_dir: Callable[[], Path]) -> tuple[str, ...]:
    exe = argv[0]
    if os.path.isabs(exe) or "/" in exe:
        return argv
    candidate = bin_dir() / exe
    return (str(candidate), *argv[1:]) if candidate.exists() else argv


RunLiveTurn = Callable[..., LiveTurn]


class _RecordingPublishing(attempt.Publishing):
    """The worker's publishing (to an in-memory Redis), keeping every event sent."""

    def __init__(self, run_id: str) -> None:
        redis = fakeredis.FakeRedis(decode_responses=True)
        super().__init__(
            RedisStreamPublisher(redis, Keys("conformance"), run_id, 1, maxlen=100_000)
        )
        self.events: list[Event] = []

    def send(self, events: list[Event]) -> None:
        self.events += events
        super().send(events)


class _Tee:
    """A sandbox process whose stdout is also kept, for a failing test to show."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self.stdout = bytearray()

    def read(self, timeout: float | None) -> Chunk | None:
        chunk = self._process.read(timeout)
        if chunk is not None and chunk.stream == "stdout":
            self.stdout += chunk.data
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._process, name)


@pytest.fixture
def run_live_turn(
    request: pytest.FixtureRequest,
    fake_model: FakeModelServer,
    live_sandbox: LocalSandbox,
    live_placement: Callable[[], Placement],
) -> RunLiveTurn:
    """Runs one turn of a harness for real. Call it as::

        turn = run_live_turn("claude-code", TurnRequest(input="[scenario:tool] go"))
        turn2 = run_live_turn("claude-code", TurnRequest(input="again", turn=2,
                              resume_session=turn.state.session_id),
                              placement=turn.placement)

    ``request`` may also be a plain string (the input). Its ``workspace`` and ``home`` are
    replaced by the placement's paths (a new placement unless one is given), ``base_url``
    defaults to the fake server's (with ``/v1`` for OpenAI-style APIs), and the names of
    ``secrets`` (default: :data:`DEFAULT_SECRETS` for the harness) are added to
    ``granted_env``. A bare executable name in the command's argv is resolved to the
    installed CLI (fixture ``clis``, installed on first need). The request is fitted to the
    adapter's capabilities as the worker fits it (``worker.options.policy.fit_request``). The process
    runs with stdin as the command says and is read by ``worker.turn.attempt.drive``, as a
    worker reads it: until its terminal message (then :data:`EXIT_GRACE_S` to exit) or its
    streams close, or until ``timeout`` passes (then the turn ends with a ``timeout``
    session-error); it is killed on every path.
    """

    def run(
        harness_id: str,
        turn_request: TurnRequest | str,
        *,
        placement: Placement | None = None,
        secrets: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> LiveTurn:
        adapter = adapters.get(harness_id)
        if placement is None:
            placement = live_placement()
        if isinstance(turn_request, str):
            turn_request = TurnRequest(input=turn_request)
        granted = dict(DEFAULT_SECRETS.get(harness_id, {}) if secrets is None else secrets)
        turn_request = dataclasses.replace(
            turn_request,
            workspace=placement.workspace,
            home=placement.home,
            base_url=turn_request.base_url or base_url_for(harness_id, fake_model),
            granted_env=turn_request.granted_env | frozenset(granted),
        )
        turn_request = fit_request(turn_request, adapter.CAPABILITIES)
        command = adapter.build_command(turn_request)
        argv = _resolve(command.argv, lambda: request.getfixturevalue("clis"))
        spec = ExecSpec(
            argv=argv,
            stdin=command.stdin,
            env=dict(command.env),
            files=dict(command.files),
            cwd=command.cwd,
        )
        # The worker's own read loop (worker.turn.attempt.drive, as worker.turn.execute runs it): the
        # stream driver fed as output arrives, events published (to an in-memory Redis),
        # the turn timed out and the process killed by the code that does it in production.
        driver = StreamDriver(adapter, turn_request)
        out = _RecordingPublishing(placement.run_id)
        seen = len(fake_model.requests)
        started = time.monotonic()
        limits = attempt.Limits(
            deadline=started + timeout,
            idle_s=timeout,
            exit_grace_s=EXIT_GRACE_S,
            kill_grace_s=1.0,
        )
        process = _Tee(live_sandbox.start(placement, spec, granted))
        outcome = attempt.drive(process, driver, out, limits, lambda: None)
        terminal = outcome.terminal
        timed_out = isinstance(terminal, SessionError) and terminal.error in (
            "the turn timed out",
            f"the harness produced no output for {timeout:g}s",
        )
        return LiveTurn(
            harness=harness_id,
            request=turn_request,
            command=command,
            argv=argv,
            placement=placement,
            events=[*out.events, terminal],
            driver=driver,
            exit_code=outcome.exit_code,
            stdout=bytes(process.stdout),
            stderr=outcome.stderr_tail,
            requests=fake_model.requests[seen:],
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    return run
