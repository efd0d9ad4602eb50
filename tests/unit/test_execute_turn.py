"""worker.turn.execute.execute_turn without Celery: fakeredis, LocalSandbox and the demo harness."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

import adapters
from config import Settings, load_settings
from sandbox.local import LocalSandbox
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.store.keys import Keys
from worker.store.records import RunStore
from worker.turn.execute import Shutdown, TurnDeps, execute_turn

DEMO = Path(__file__).resolve().parents[2] / "harnesses" / "demo.py"
PREFIX = "tt"


@dataclass
class World:
    deps: TurnDeps
    client: fakeredis.FakeRedis
    keys: Keys
    store: RunStore
    root: Path
    executable: str

    def run(self, *, warnings: list[str] | None = None, **options: Any) -> str:
        """Create a run record (turn 1 in flight) and return its id; ``warnings``: the
        producer's, as its client records them."""
        options.setdefault("harness", "stdio-json")
        options.setdefault("executable", self.executable)
        options.setdefault("sandbox", "local")
        run_id = new_run_id()
        self.store.create(
            run_id, RunOptions(**options), queue="q", sandbox="local", warnings=warnings
        )
        return run_id

    def turn(self, run_id: str, text: str, turn: int = 1) -> str:
        return execute_turn(self.deps, TurnPayload(run_id=run_id, turn=turn, input=text))

    def events(self, run_id: str, turn: int | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        low, high = ("-", "+") if turn is None else (str(turn), str(turn))
        return [
            (entry_id, fields["type"], json.loads(fields["data"]))
            for entry_id, fields in self.client.xrange(self.keys.events(run_id), low, high)
        ]

    def workspace(self, run_id: str) -> Path:
        return self.root / "local" / "run" / run_id

    def sessions(self, run_id: str) -> list[Path]:
        folder = self.workspace(run_id) / ".home" / ".demo-sessions"
        return sorted(folder.iterdir()) if folder.exists() else []


@pytest.fixture
def make_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., World]]:
    """A factory of worlds sharing one workspace root; every sandbox is torn down after."""
    for name in list(os.environ):
        if name.startswith("HARNESS_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    # A wrapper with an absolute interpreter: the sandbox's HOME is the run's, not ours.
    wrapper = tmp_path / "harness-demo"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DEMO}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    sandboxes: list[LocalSandbox] = []

    def make(**overrides: Any) -> World:
        overrides.setdefault("allowed_executables", ("*",))
        settings: Settings = load_settings(
            sandbox="local",
            key_prefix=PREFIX,
            workspace_root=str(tmp_path),
            exit_grace_s=1.0,
            kill_grace_s=0.2,
            **overrides,
        )
        client = fakeredis.FakeRedis(decode_responses=True)
        keys = Keys(PREFIX)
        store = RunStore(client, keys, settings.retention_s)
        sandbox = LocalSandbox(tmp_path / "local")
        sandboxes.append(sandbox)
        deps = TurnDeps(
            settings=settings,
            redis=client,
            keys=keys,
            store=store,
            sandbox_for=lambda backend: sandbox,
            worker_id="test-host:1",
            shutdown=Shutdown(settings.shutdown_grace_s),
        )
        return World(deps, client, keys, store, tmp_path, str(wrapper))

    yield make
    for sandbox in sandboxes:
        for found in sandbox.managed():
            sandbox.teardown(found.run_id)


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    return make_world()


def _types(events: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return [kind for _, kind, _ in events]


def _assert_one_turn(events: list[tuple[str, str, dict[str, Any]]], turn: int) -> None:
    """Ids ``{turn}-0..n`` contiguous; one turn-started first; one terminal, last."""
    assert [entry_id for entry_id, _, _ in events] == [f"{turn}-{i}" for i in range(len(events))]
    types = _types(events)
    assert types[0] == "turn-started"
    assert types.count("turn-started") == 1
    terminals = [t for t in types if t in ("turn-complete", "session-error")]
    assert len(terminals) == 1
    assert types[-1] in ("turn-complete", "session-error")


def test_completed_turn_publishes_events_in_order(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "hello there world") == "completed"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert _types(events) == [
        "turn-started",
        "session",
        "assistant-text",
        "sandbox-activity",
        "assistant-text",
        "usage",
        "workspace",  # the worker's snapshot of what the turn changed: nothing
        "turn-complete",
    ]
    started, complete = events[0][2], events[-1][2]
    change = events[-2][2]
    assert (change["added"], change["modified"], change["deleted"]) == ([], [], [])
    assert change["snapshot"] and change["complete"]
    assert started == {"harness": "stdio-json", "attempt": 1, "input_chars": 17}
    assert complete["text"] == "You said: hello there world"
    assert complete["exit_code"] == 0
    assert complete["model"] == "demo-1"


def test_completed_turn_updates_run_record(world: World) -> None:
    run_id = world.run()
    world.turn(run_id, "hello there world")
    record = world.store.get(run_id)
    session_id = world.events(run_id)[1][2]["session_id"]
    assert record["status"] == "idle"
    assert record["turns"] == 1
    assert record["input_tokens"] == 3 + 12
    assert record["output_tokens"] == 9
    assert record["cost_usd"] == 0.0
    assert record["session_id"] == session_id
    assert record["resumed"] is False
    assert record["model_reported"] == "demo-1"
    assert record["last_error"] is None
    assert record["sandbox"] == "local"
    assert world.store.transcript(run_id) == [
        {"turn": 1, "input": "hello there world", "output": "You said: hello there world"}
    ]


def test_second_turn_resumes_session(world: World) -> None:
    run_id = world.run()
    world.turn(run_id, "first")
    first_session = world.store.get(run_id)["session_id"]
    assert world.store.begin_turn(run_id) == 2
    assert world.turn(run_id, "second", turn=2) == "completed"
    events = world.events(run_id, 2)
    _assert_one_turn(events, 2)
    session = next(data for _, kind, data in events if kind == "session")
    assert session == {"session_id": first_session, "resumed": True, "model": "demo-1"}
    assert "turn 2 of this session" in events[-1][2]["text"]
    record = world.store.get(run_id)
    assert (record["status"], record["turns"], record["resumed"]) == ("idle", 2, True)
    assert record["input_tokens"] == (1 + 12) + (1 + 12)


def test_stale_resume_retried_fresh_without_replay_when_no_transcript(world: World) -> None:
    run_id = world.run(resume_session="demo-stale")
    assert world.turn(run_id, "hi") == "completed"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert "usage" in _types(events)
    assert all(data["source"] == "harness" for _, kind, data in events if kind == "usage")
    session = next(data for _, kind, data in events if kind == "session")
    assert session["resumed"] is False
    assert session["session_id"] != "demo-stale"
    assert events[-1][2]["text"] == "You said: hi"
    assert world.store.get(run_id)["session_id"] == session["session_id"]


def test_stale_resume_replays_transcript_when_one_exists(world: World) -> None:
    run_id = world.run()
    world.turn(run_id, "remember the number 42")
    for session_file in world.sessions(run_id):
        session_file.unlink()  # the vendor forgot the session
    world.store.begin_turn(run_id)
    assert world.turn(run_id, "what was the number?", turn=2) == "completed"
    events = world.events(run_id, 2)
    _assert_one_turn(events, 2)
    replays = [data for _, kind, data in events if kind == "usage" and data["source"] == "replay"]
    assert len(replays) == 1
    assert replays[0]["input_tokens"] > 0
    assert _types(events).index("usage") < _types(events).index("session")
    final = events[-1][2]["text"]
    assert final.startswith("You said: [The previous session could not be resumed.")
    session = next(data for _, kind, data in events if kind == "session")
    assert session["resumed"] is False
    assert world.store.get(run_id)["session_id"] == session["session_id"]


def test_cancel_before_start_gives_cancelled_and_runs_nothing(world: World) -> None:
    run_id = world.run()
    world.client.set(world.keys.cancel(run_id, 1), "1")
    assert world.turn(run_id, "hello") == "failed:cancelled"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert _types(events) == ["turn-started", "session-error"]
    assert events[-1][2]["reason"] == "cancelled"
    assert events[-1][2]["error"] == "the turn was cancelled before it started"  # the claim saw it
    assert events[-1][2]["retryable"] is False
    assert not world.workspace(run_id).exists()


def test_idle_timeout_ends_turn_with_timeout(make_world: Callable[..., World]) -> None:
    world = make_world(idle_timeout_s=0.5)
    run_id = world.run()
    started = time.monotonic()
    assert world.turn(run_id, "@sleep 30") == "failed:timeout"
    assert time.monotonic() - started < 5
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    error = events[-1][2]
    assert error["reason"] == "timeout"
    assert error["retryable"] is True
    assert "no output" in error["error"]
    assert world.store.get(run_id)["status"] == "idle"


def test_turn_timeout_ends_turn_with_timeout(make_world: Callable[..., World]) -> None:
    world = make_world(turn_timeout_s=1.0, idle_timeout_s=10.0)
    run_id = world.run()
    started = time.monotonic()
    assert world.turn(run_id, "@stream 200 0.05") == "failed:timeout"
    assert time.monotonic() - started < 6
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert events[-1][2]["reason"] == "timeout"
    assert "timed out" in events[-1][2]["error"]
    assert "assistant-text" in _types(events)


def test_producer_timeout_ends_turn_with_timeout(world: World) -> None:
    run_id = world.run(timeout_s=1.0)
    started = time.monotonic()
    assert world.turn(run_id, "@sleep 30") == "failed:timeout"
    assert time.monotonic() - started < 6


def test_cancel_mid_turn_gives_cancelled(world: World) -> None:
    run_id = world.run()
    timer = threading.Timer(0.5, lambda: world.client.set(world.keys.cancel(run_id, 1), "1"))
    timer.start()
    try:
        started = time.monotonic()
        assert world.turn(run_id, "@text working\n@sleep 30") == "failed:cancelled"
        assert time.monotonic() - started < 5
    finally:
        timer.cancel()
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert _types(events) == [
        "turn-started",
        "session",
        "assistant-text",
        "workspace",  # a cancelled turn's work is recorded too
        "session-error",
    ]
    assert events[-1][2]["reason"] == "cancelled"


def test_harness_lingering_after_terminal_killed_after_exit_grace(world: World) -> None:
    run_id = world.run()
    started = time.monotonic()
    assert world.turn(run_id, "@complete done early\n@sleep 30") == "completed"
    elapsed = time.monotonic() - started
    assert elapsed < world.deps.settings.exit_grace_s + 4
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    complete = events[-1][2]
    assert complete["text"] == "done early"
    assert complete["exit_code"] is not None and complete["exit_code"] < 0  # killed


def test_exit_without_terminal_gives_exit_reason(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "@text partial\n@stderr going down\n@exit 3") == "failed:exit"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    error = events[-1][2]
    assert (error["reason"], error["exit_code"], error["retryable"]) == ("exit", 3, True)
    assert "going down" in error["stderr_tail"]
    record = world.store.get(run_id)
    assert record["status"] == "idle"
    assert record["last_error"].startswith("exit:")


def test_harness_error_reported_with_exit_code(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "@error model melted") == "failed:harness-error"
    error = world.events(run_id)[-1][2]
    assert error["error"] == "model melted"
    assert error["exit_code"] == 0


def test_executable_not_allowed_gives_invalid_input_and_runs_nothing(
    make_world: Callable[..., World],
) -> None:
    world = make_world(allowed_executables=("harness-demo",))
    run_id = world.run()
    assert world.turn(run_id, "hello") == "failed:invalid-input"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert _types(events) == ["turn-started", "session-error"]
    error = events[-1][2]
    assert error["reason"] == "invalid-input"
    assert "HARNESS_ALLOWED_EXECUTABLES" in error["error"]
    assert not world.workspace(run_id).exists()
    assert world.store.get(run_id)["status"] == "failed"


def test_empty_input_gives_invalid_input(world: World) -> None:
    run_id = world.run()
    assert world.turn(run_id, "   ") == "failed:invalid-input"
    assert not world.workspace(run_id).exists()


def test_redelivered_turn_runs_harness_once_and_adds_no_events(world: World) -> None:
    run_id = world.run()
    payload = TurnPayload(run_id=run_id, turn=1, input="only once")
    assert execute_turn(world.deps, payload) == "completed"
    before = world.events(run_id)
    record = world.store.get(run_id)
    assert execute_turn(world.deps, payload) == "duplicate"
    assert world.events(run_id) == before
    assert len(world.sessions(run_id)) == 1
    after = world.store.get(run_id)
    assert after["input_tokens"] == record["input_tokens"]


def test_redelivered_turn_in_flight_elsewhere_left_alone(world: World) -> None:
    run_id = world.run()
    world.client.set(world.keys.turn_started(run_id, 1), "other-host:7")
    world.client.set(world.keys.turn_owner(run_id, 1), "other-host:7", ex=30)
    assert world.turn(run_id, "hello") == "duplicate"
    assert world.events(run_id) == []
    assert not world.workspace(run_id).exists()


def test_orphaned_turn_closed_with_worker_lost(world: World) -> None:
    run_id = world.run()
    world.client.set(world.keys.turn_started(run_id, 1), "dead-host:9")
    assert world.turn(run_id, "hello") == "worker-lost"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert _types(events) == ["turn-started", "session-error"]
    error = events[-1][2]
    assert error["reason"] == "worker-lost"
    assert error["retryable"] is True
    assert world.store.get(run_id)["last_error"].startswith("worker-lost")
    assert not world.workspace(run_id).exists()


def test_orphaned_turn_with_partial_events_gets_terminal_after_them(world: World) -> None:
    run_id = world.run()
    world.client.set(world.keys.turn_started(run_id, 1), "dead-host:9")
    stream = world.keys.events(run_id)
    world.client.xadd(stream, {"type": "turn-started", "data": "{}", "ts": "1"}, id="1-0")
    world.client.xadd(stream, {"type": "assistant-text", "data": "{}", "ts": "1"}, id="1-1")
    assert world.turn(run_id, "hello") == "worker-lost"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert _types(events) == ["turn-started", "assistant-text", "session-error"]


def test_unknown_run_ignored(world: World) -> None:
    run_id = new_run_id()
    assert world.turn(run_id, "hello") == "unknown-run"
    assert world.events(run_id) == []


def test_granted_secret_reaches_harness_and_is_masked(
    make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEMO_TOKEN", "tok-very-secret-123")
    monkeypatch.setenv("NOT_GRANTED", "worker-only-value")
    world = make_world()
    run_id = world.run(grants=("DEMO_TOKEN",))
    assert world.turn(run_id, "@env DEMO_TOKEN\n@env NOT_GRANTED") == "completed"
    texts = [data["text"] for _, kind, data in world.events(run_id) if kind == "assistant-text"]
    assert texts == ["DEMO_TOKEN=[masked]", "NOT_GRANTED=<unset>"]
    dump = json.dumps(world.events(run_id))
    assert "tok-very-secret-123" not in dump


def test_shutdown_ends_turn_with_shutdown_reason(world: World) -> None:
    world.deps.shutdown.request(immediate=True)
    run_id = world.run()
    started = time.monotonic()
    assert world.turn(run_id, "@sleep 30") == "failed:shutdown"
    assert time.monotonic() - started < 5
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert events[-1][2]["reason"] == "shutdown"
    assert events[-1][2]["retryable"] is True


class _FlakyRedis:
    """The real (fake) Redis, but the next ``fail`` calls of ``method`` raise as a Redis blip
    does. A blip just after a claim cannot be timed for real; this is where it is produced."""

    def __init__(self, client: fakeredis.FakeRedis, method: str, fail: int, skip: int) -> None:
        self._client, self._method, self.fail, self.skip = client, method, fail, skip

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name != self._method:
            return attr

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if self.skip > 0:
                self.skip -= 1
            elif self.fail > 0:
                self.fail -= 1
                raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379.")
            return attr(*args, **kwargs)

        return flaky


def test_a_redis_blip_after_the_claim_is_ridden_out(world: World) -> None:
    run_id = world.run()
    # The first read (a pipeline: the record and its long hash) is the options, before the
    # claim; the second, after it, blips.
    flaky = _FlakyRedis(world.client, "pipeline", fail=3, skip=1)
    world.deps.store.redis = flaky
    assert world.turn(run_id, "hello there") == "completed"
    assert flaky.fail == 0
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert events[-1][1] == "turn-complete"


def test_an_error_of_the_worker_ends_the_turn_as_internal_and_keeps_the_run(
    world: World,
) -> None:
    run_id = world.run()
    sandbox = world.deps.sandbox_for("local")

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug in the worker")

    world.deps.sandbox_for = lambda backend: type(  # type: ignore[assignment]
        "Broken",
        (),
        {
            "prepare": broken,
            "backend": "local",
            "teardown": sandbox.teardown,
            "root": sandbox.root,
        },
    )()
    assert world.turn(run_id, "hello") == "failed:internal"
    events = world.events(run_id)
    _assert_one_turn(events, 1)
    assert events[0][2]["harness"] == "stdio-json"
    error = events[-1][2]
    assert (error["reason"], error["retryable"]) == ("internal", True)
    assert "RuntimeError: a bug in the worker" in error["error"]
    assert world.store.get(run_id)["status"] == "idle"
    assert not world.client.exists(world.keys.turn_owner(run_id, 1))


def test_a_claim_whose_reply_was_lost_is_recognised_by_its_retry(world: World) -> None:
    from worker.turn.life import TurnLife

    run_id = world.run()
    first = TurnLife(world.deps, run_id, 1, "stdio-json")
    assert first.claim("delivery-1")
    first.release()  # the reply was lost: the delivery raised, nothing runs here
    assert TurnLife(world.deps, run_id, 1, "stdio-json").claim("delivery-1")  # the retry
    assert not TurnLife(world.deps, run_id, 1, "stdio-json").claim("delivery-2")  # a copy


def test_the_claim_takes_the_turns_queued_entry_and_says_whether_a_cancel_is_marked(
    world: World,
) -> None:
    from worker.store.queued import QueuedTurn
    from worker.turn.life import TurnLife

    run_id = world.run()
    payload = TurnPayload(run_id=run_id, turn=1, input="hi").model_dump()
    QueuedTurn.first(payload, "q", 100.0).write(world.client, world.keys, run_id, 1, 60)
    first = TurnLife(world.deps, run_id, 1, "stdio-json")
    assert first.claim("delivery-1")
    assert first.claimed.queued is not None
    assert QueuedTurn.model_validate_json(first.claimed.queued).first_sent_at == 100.0
    assert not first.claimed.cancelled
    assert not world.client.exists(world.keys.turn_queued(run_id, 1))  # no longer waiting
    first.release()
    # The same delivery again (its first claim's reply lost): claimed, the entry gone.
    world.client.set(world.keys.cancel(run_id, 1), "1")
    retry = TurnLife(world.deps, run_id, 1, "stdio-json")
    assert retry.claim("delivery-1")
    assert retry.claimed.queued is None
    assert retry.claimed.cancelled
    retry.release()


def test_patience_is_one_budget_for_the_whole_turn() -> None:
    from worker.store.terminal import Patience

    patience = Patience(budget_s=1.0)
    calls = [0]

    def down() -> None:
        calls[0] += 1
        raise redis.ConnectionError("down")

    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        patience.call(down)
    with pytest.raises(redis.ConnectionError):
        patience.call(down)  # no fresh budget for a second call
    assert time.monotonic() - started < 2.0
    assert calls[0] >= 3


def test_a_second_delivery_to_the_process_holding_the_turn_is_a_duplicate(world: World) -> None:
    from worker.turn.life import TurnLife

    run_id = world.run()
    holder = TurnLife(world.deps, run_id, 1, "stdio-json")
    assert holder.claim("delivery-1")
    # The same message again (same delivery id) while the turn runs here: not a retry.
    assert not TurnLife(world.deps, run_id, 1, "stdio-json").claim("delivery-1")
    holder.release()
    assert TurnLife(world.deps, run_id, 1, "stdio-json").claim("delivery-1")


def test_one_unreadable_run_does_not_stop_the_reaper_for_the_others(world: World) -> None:
    from worker.fleet.lifecycle import ReapReport, close_lost_turns

    broken, lost = world.run(), world.run()
    world.client.hset(world.keys.run(broken), "options", "{not json")
    for run_id in (broken, lost):
        world.client.sadd(world.keys.runs_index(), run_id)
        world.client.set(world.keys.turn_started(run_id, 1), "dead-host:9")
    report = ReapReport()
    close_lost_turns(world.deps, report)
    assert report.lost_turns == [f"{lost}/1"]
    assert world.events(lost)[-1][2]["reason"] == "worker-lost"


def test_the_run_names_its_host_queue_before_its_sandbox_is_made(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.deps.host_queues["local"] = "tt.host.local.here"
    run_id = world.run()
    seen: list[str | None] = []
    sandbox = world.deps.sandbox_for("local")
    prepare = sandbox.prepare

    def spying(spec: Any) -> Any:
        seen.append(world.store.record(run_id).queue)
        return prepare(spec)

    sandbox.prepare = spying  # type: ignore[method-assign]
    assert world.turn(run_id, "hello") == "completed"
    assert seen == ["tt.host.local.here"]


# -- the worker acts on capabilities (stdio-json: no system-prompt channel, no model selection,
# no permission policy) ----------------------------------------------------------------------


@pytest.mark.parametrize("has_channel", [False, True])
def test_system_prompt_without_a_channel_reaches_the_harness_in_its_input(
    world: World, monkeypatch: pytest.MonkeyPatch, has_channel: bool
) -> None:
    adapter = adapters.get("stdio-json")
    caps = dataclasses.replace(adapter.CAPABILITIES, system_prompt=has_channel)
    monkeypatch.setattr(adapter, "CAPABILITIES", caps)
    run_id = world.run(system_prompt="SYS-MARK-9d")
    assert world.turn(run_id, "hello") == "completed"
    done = world.events(run_id)[-1][2]
    # The demo answers "You said: <its input>". Declared as a channel the adapter does not
    # have, the prompt would be lost: the flag is what puts it in the input.
    assert ("SYS-MARK-9d" in done["text"]) is not has_channel
    assert done["text"].endswith("hello")


def test_what_the_harness_cannot_apply_is_in_the_run_record(world: World) -> None:
    run_id = world.run(model="demo-9", posture="strict", deny=("Bash(rm *)",))
    assert world.turn(run_id, "hello") == "completed"
    warnings = world.store.get(run_id)["warnings"]
    assert len(warnings) == 2, warnings
    assert "enforces no permission policy" in warnings[0]
    assert "model_selection" in warnings[1] and "demo-9" in warnings[1]


def test_the_workers_policy_decides_the_warnings_over_the_producers(world: World) -> None:
    """The producer's client records what it resolved; the first turn's worker writes its
    own over them when they differ, and leaves them when they agree."""
    stale = world.run(warnings=["a producer's stale warning"])
    assert world.turn(stale, "hello") == "completed"
    (written,) = world.store.get(stale)["warnings"]
    assert "enforces no permission policy" in written
    agreed = world.run(model="demo-9", posture="strict", deny=("Bash(rm *)",))
    assert world.turn(agreed, "hello") == "completed"
    theirs = world.store.get(agreed)["warnings"]
    same = world.run(warnings=theirs, model="demo-9", posture="strict", deny=("Bash(rm *)",))
    writes: list[object] = []
    update = world.store.update
    world.store.update = lambda run_id, **changes: (  # type: ignore[method-assign]
        writes.append(changes.get("warnings")),
        update(run_id, **changes),
    )[1]
    assert world.turn(same, "hello") == "completed"
    assert world.store.get(same)["warnings"] == theirs
    assert writes.count(None) == len(writes)  # no write of the warnings
