"""Races in the life of a turn and a run, produced for real against real Redis (a controlled
interleaving only where the race itself cannot be timed otherwise):

- a late close of a lost turn (a reaper racing its worker's renewal, a redelivered copy of an
  old turn) never revokes a live turn's credential, nor denies its permission requests;
- the copy of a turn that loses the claim never releases the winner's key slot;
- a run's followers (the webhook scanner of a real ``harness api``, its SSE streams, ``harness
  events --follow``) end exactly at the run's end: every terminal delivered however long the
  stream, the last turn's terminal included, and no grace period waited.

The worker's side of the (c) cases is written by the worker's own functions (a claim, a
publisher, the one terminal writer, the run's end) from this process: what is under test is
the readers, in their real processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.events import AssistantText, TurnComplete, TurnStarted
from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import DEMO, Env, make_env
from tests.integration.in_process import turn_deps
from tests.integration.test_api_sse import parse
from tests.integration.test_api_webhooks import Receiver, receiver  # noqa: F401 -- fixture
from worker.client import HarnessClient
from worker.deps import Shutdown, TurnDeps
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.permissions import requests as permissions
from worker.spend import slots
from worker.store import credentials
from worker.store.publisher import RedisStreamPublisher
from worker.store.records import RunStore
from worker.turn.execute import close_lost_turn, execute_turn
from worker.turn.life import TurnLife

# Mostly waiting on real time (faults, drains, handlers asleep): in the parallel phase.
pytestmark = [pytest.mark.redis, pytest.mark.long]

SLOT_KEY = "race-slot-key-5d1e"


@dataclasses.dataclass
class World:
    deps: TurnDeps
    client: HarnessClient
    sent: list[tuple[dict[str, Any], str, float]]
    executable: str

    def new_run(self, **options: Any) -> str:
        run_id = new_run_id()
        self.deps.store.create(
            run_id,
            RunOptions(harness="stdio-json", executable=self.executable, **options),
            queue="q",
            sandbox="local",
        )
        return run_id


@pytest.fixture
def world(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("DEMO_TOKEN", SLOT_KEY)
    sent: list[tuple[dict[str, Any], str, float]] = []
    with turn_deps(
        tmp_path, redis_url, "races",
        send_turn=lambda payload, queue, countdown: sent.append((payload, queue, countdown)),
        grants="stdio-json=DEMO_TOKEN", key_slots="DEMO_TOKEN=1",
    ) as (deps, client, executable):  # fmt: skip
        yield World(deps, client, sent, executable)


def _entries(deps: TurnDeps, run_id: str, turn: int) -> list[tuple[str, str]]:
    found = deps.redis.xrange(deps.keys.events(run_id), f"{turn}-0", f"{turn}-18446744073709551615")
    return [(entry_id, fields["type"]) for entry_id, fields in found]


def _ask_pending(deps: TurnDeps, run_id: str, turn: int) -> str:
    """A permission request of ``turn`` waiting for an answer, as a turn's asker records it."""
    request_id = f"p{turn}-1"
    record = {"request_id": request_id, "run_id": run_id, "turn": turn, "n": 1, "tool": "Bash",
              "deadline": time.time() + 600, "asked_at": time.time()}  # fmt: skip
    deps.redis.hset(deps.keys.permissions(run_id), request_id, json.dumps(record))
    return request_id


# -- (a) a lost-turn close never revokes a live turn's credential ------------------------------


def test_a_lost_turn_close_racing_its_workers_renewal_leaves_the_turn_its_token(
    world: World,
) -> None:
    """The reaper found turn 1's heartbeat gone (Redis away from its worker for a TTL), and
    before its close ran, the worker took its hold again. The close finds the turn owned: it
    must end nothing, revoke nothing, deny nothing."""
    deps = world.deps
    run_id = world.new_run()
    life = TurnLife(deps, run_id, 1, "stdio-json")
    assert life.claim("d1")
    try:
        token = life.issue_credential()
        request_id = _ask_pending(deps, run_id, 1)
        deps.redis.delete(deps.keys.turn_owner(run_id, 1))  # the reaper sees it lapsed...
        assert life._renew()  # ...and its worker takes it again before the close runs
        close_lost_turn(deps, run_id, 1, "stdio-json")
        assert credentials.verify(deps.redis, deps.keys, run_id, token)
        assert [p["request_id"] for p in permissions.pending(deps.redis, deps.keys, run_id)] == [
            request_id
        ]
        assert _entries(deps, run_id, 1) == []  # and no terminal: the turn is its worker's
    finally:
        life.release()


def test_a_redelivered_copy_of_an_old_turn_leaves_the_live_turns_token(world: World) -> None:
    """Turn 1 completed and turn 2 runs with its token; a copy of turn 1's message arrives
    (a broker's redelivery) after the stream was trimmed past turn 1's terminal. The copy
    runs nothing and must not revoke turn 2's token."""
    deps = world.deps
    run_id = world.new_run()
    first = TurnPayload(run_id=run_id, turn=1, input="@complete one")
    assert execute_turn(deps, first, delivery="d1") == "completed"
    assert deps.store.begin_turn(run_id) == 2
    second = TurnLife(deps, run_id, 2, "stdio-json")
    assert second.claim("d2")
    try:
        token = second.issue_credential()
        deps.redis.xtrim(deps.keys.events(run_id), minid="2-0")  # MAXLEN trimmed turn 1 away
        execute_turn(deps, first, delivery="a-copy")
        assert credentials.verify(deps.redis, deps.keys, run_id, token)
        assert _entries(deps, run_id, 1) == []  # nothing was written for the old turn
    finally:
        second.release()


def test_a_turns_end_revokes_its_own_credential_never_a_later_turns(world: World) -> None:
    deps = world.deps
    run_id = world.new_run()
    later = credentials.issue(deps.redis, deps.keys, run_id, 60, turn=3)
    assert not credentials.revoke(deps.redis, deps.keys, run_id, through=2)
    assert credentials.verify(deps.redis, deps.keys, run_id, later)
    assert credentials.revoke(deps.redis, deps.keys, run_id, through=3)
    assert not credentials.verify(deps.redis, deps.keys, run_id, later)


# -- (b) the copy that loses the claim keeps its hands off the winner's key slot ---------------


def test_the_copy_of_a_turn_that_loses_the_claim_leaves_the_winner_its_key_slot(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two copies of one turn (a broker's redelivery) both reach the key slot before either
    claims: copy A takes the slot, copy B asks, then A claims and B's claim is refused. While
    A's harness runs, the key's one slot must still be A's: another run's turn waits."""
    deps = world.deps
    run_id = world.new_run(grants=("DEMO_TOKEN",))
    payload = TurnPayload(run_id=run_id, turn=1, input="@text started\n@sleep 3\n@complete a")
    b_asked, a_claimed, a_at_claim = threading.Event(), threading.Event(), threading.Event()
    real_claim = TurnLife.claim

    def claim(self: TurnLife, delivery: str | None) -> bool:
        # The interleaving: A holds its claim until B has asked for the slot; B claims after A.
        if delivery == "a":
            a_at_claim.set()
            assert b_asked.wait(30)
            try:
                return real_claim(self, delivery)
            finally:
                a_claimed.set()
        b_asked.set()
        assert a_claimed.wait(30)
        return real_claim(self, delivery)

    monkeypatch.setattr(TurnLife, "claim", claim)
    outcomes: dict[str, str] = {}

    def copy(name: str) -> None:
        try:
            outcomes[name] = execute_turn(deps, payload, delivery=name)
        finally:
            b_asked.set()  # B may stop before its claim (it found the slot held)

    a = threading.Thread(target=copy, args=("a",))
    a.start()
    assert a_at_claim.wait(30)
    b = threading.Thread(target=copy, args=("b",))
    b.start()
    b.join(30)
    assert outcomes.get("b") in ("duplicate", "waiting-for-slot"), outcomes
    deadline = time.monotonic() + 30
    while not any(t == "assistant-text" for _, t in _entries(deps, run_id, 1)):
        assert time.monotonic() < deadline, "copy A never started its harness"
        time.sleep(0.05)

    digest = slots.credential_hash(SLOT_KEY)
    holders = deps.redis.zrange(deps.keys.slots(digest, "holders"), 0, -1)
    assert len(holders) == 1, holders  # A's hold, while A's harness runs
    other = world.new_run(grants=("DEMO_TOKEN",), producer="p2")
    options = deps.store.record(other).options
    assert options is not None
    taken = slots.take(deps, TurnPayload(run_id=other, turn=1, input="x"), options)
    if taken is not None:
        taken.release()
    assert taken is None  # the key's one slot is A's: another run's turn waits
    a.join(30)
    assert outcomes.get("a") == "completed", outcomes
    assert deps.redis.zcard(deps.keys.slots(digest, "holders")) == 0  # A let go at its end


# -- (c) one end of a run's stream, for every follower -----------------------------------------


@pytest.fixture
def api_world(tmp_path: Path, redis_url: str) -> Iterator[tuple[Env, ApiProcess]]:
    env = make_env(tmp_path, redis_url, HARNESS_API_KEEPALIVE_S="0.5")
    api = start_api(
        env,
        "races",
        HARNESS_WEBHOOK_SCHEMES="http",
        HARNESS_WEBHOOK_HOSTS="127.0.0.1",
        HARNESS_WEBHOOK_POLL_S="0.5",
        HARNESS_WEBHOOK_BACKOFF_S="0.2",
    )
    api.add_tenant("racer")
    yield env, api
    api.stop()
    env.close()


def _deps(env: Env) -> TurnDeps:
    settings = env.settings()
    client = env.client()
    return TurnDeps(
        settings=settings,
        redis=client.redis,
        keys=env.keys,
        store=RunStore(client.redis, env.keys, settings.retention_s),
        sandbox_for=lambda backend: None,  # type: ignore[arg-type,return-value]
        worker_id="races-worker:1",
        shutdown=Shutdown(0),
    )


def _start(api: ApiProcess, **options: Any) -> str:
    """A run started through the API; its first turn stays queued (no worker consumes it)."""
    with api.client("racer") as http:
        body = {"harness": "stdio-json", "executable": DEMO, "input": "x", **options}
        response = http.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def _claimed(deps: TurnDeps, run_id: str, texts: int) -> tuple[TurnLife, RedisStreamPublisher]:
    """Turn 1 claimed as a worker claims it, its ``turn-started`` and ``texts`` texts out."""
    life = TurnLife(deps, run_id, 1, "stdio-json")
    assert life.claim("w1")
    publisher = RedisStreamPublisher(
        deps.redis, deps.keys, run_id, 1, maxlen=deps.settings.stream_maxlen
    )
    started = TurnStarted(harness="stdio-json", attempt=1, input_chars=1)
    publisher.publish([started, *(AssistantText(text=f"line {i}") for i in range(texts))])
    assert publisher.flush(force=True)
    life.publisher = publisher
    return life, publisher


def _end_abandoned(env: Env, run_id: str) -> float:
    """``harness end`` of a run whose worker never confirms (its turn still held): the end
    given up on after a second, as the client does. When it returned."""
    env.client().end(run_id, timeout=1.0)
    return time.monotonic()


def test_every_terminal_of_a_long_stream_is_delivered_before_the_runs_end(
    api_world: tuple[Env, ApiProcess],
    receiver: Receiver,  # noqa: F811
) -> None:
    """A run writes 8,000 events and its turn's terminal between two scans, then ends: the
    scanner reads 500 entries per run per pass. The terminal must be delivered, then the
    run's end; nothing is forgotten for a grace period having passed."""
    env, api = api_world
    deps = _deps(env)
    run_id = _start(api, webhook_url=receiver.url)
    life, _ = _claimed(deps, run_id, 8000)
    life.end(TurnComplete(text="done"), run_status="idle")
    life.release()
    deps.store.end_run(run_id)  # the worker's teardown

    def kinds() -> list[str]:
        return [json.loads(body)["type"] for _, body, _ in receiver.got]

    deadline = time.monotonic() + 60
    while "run-ended" not in kinds():
        assert time.monotonic() < deadline, kinds()
        time.sleep(0.1)
    time.sleep(2 * 0.5 + 1)  # a late terminal would have come by now
    got = kinds()
    assert got.count("turn-complete") == 1, got  # the terminal past the first 500 entries
    assert got.count("run-ended") == 1, got


def test_an_sse_stream_ends_at_the_runs_end_with_its_last_terminal_and_no_grace(
    api_world: tuple[Env, ApiProcess],
) -> None:
    """A client follows a run whose turn is still held by its worker when the run is ended
    (the end given up on: no worker confirmed it). Its stream must carry every event, the
    turn's terminal last, and close at once: neither early nor after a grace period."""
    env, api = api_world
    deps = _deps(env)
    run_id = _start(api)
    life, publisher = _claimed(deps, run_id, 3)
    try:
        with (
            api.client("racer") as http,
            http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response,
        ):
            messages: list[dict[str, Any]] = []
            buffer, ended_at = "", None
            for chunk in response.iter_text():
                buffer += chunk
                *done, buffer = buffer.split("\n\n")
                for block in done:
                    messages += parse(block + "\n\n")
                if ended_at is None and sum("id" in m for m in messages) >= 4:
                    publisher.publish(AssistantText(text=f"more {i}") for i in range(3000))
                    assert publisher.flush(force=True)
                    ended_at = _end_abandoned(env, run_id)
            closed_at = time.monotonic()
        assert ended_at is not None
        events = [m for m in messages if "id" in m]
        listed = [entry_id for entry_id, _ in _entries(deps, run_id, 1)]
        assert [m["id"] for m in events] == listed  # every event, in order
        assert events[-1]["event"] == "session-error"
        assert json.loads(events[-1]["data"])["reason"] == "cancelled"
        assert closed_at - ended_at < 3.0, closed_at - ended_at  # no 5 s grace
        # The worker that still held the turn ends it late: nothing more reaches the stream.
        publisher.publish([AssistantText(text="too late")])
        life.end(TurnComplete(text="late"), run_status="idle")
        assert [entry_id for entry_id, _ in _entries(deps, run_id, 1)] == listed
    finally:
        life.release()


def test_events_follow_ends_at_the_runs_end_with_its_last_terminal_and_no_grace(
    api_world: tuple[Env, ApiProcess],
) -> None:
    """``harness events RUN --follow`` of the same run: it prints every event, the turn's
    terminal last, and exits as the run ends."""
    env, api = api_world
    deps = _deps(env)
    run_id = _start(api)
    life, _ = _claimed(deps, run_id, 3)
    follower = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "events", run_id, "--follow", "--json"],
        cwd=ROOT,
        env={**os.environ, **env.vars},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        lines = [follower.stdout.readline() for _ in range(4)]
        assert all(lines), lines
        ended_at = _end_abandoned(env, run_id)
        out, err = follower.communicate(timeout=30)
        exited_at = time.monotonic()
        printed = [json.loads(line) for line in lines + out.splitlines() if line.strip()]
        assert follower.returncode == 0, err
        assert [e["id"] for e in printed] == [i for i, _ in _entries(deps, run_id, 1)]
        assert printed[-1]["type"] == "session-error"
        assert exited_at - ended_at < 3.0, exited_at - ended_at  # no 5 s grace
    finally:
        if follower.poll() is None:
            follower.kill()
        life.release()


def test_a_follower_of_a_run_that_ended_long_ago_reads_it_whole_and_stops(
    world: World,
) -> None:
    """The client's follow of a finished run: every event (more than one read's worth), then
    the end, at once."""
    deps = world.deps
    run_id = world.new_run()
    life = TurnLife(deps, run_id, 1, "stdio-json")
    assert life.claim("w")
    publisher = RedisStreamPublisher(deps.redis, deps.keys, run_id, 1, maxlen=100_000)
    publisher.publish([AssistantText(text=f"t{i}") for i in range(2500)])
    life.publisher = publisher
    life.end(TurnComplete(text="ok"), run_status="failed")
    life.release()
    began = time.monotonic()
    got = [e.id for e in world.client.follow_run(run_id)]
    assert time.monotonic() - began < 2.0
    assert got == [i for i, _ in _entries(deps, run_id, 1)]
    assert len(got) == 2501 and got[-1] == "1-2500"
    assert list(world.client.follow_run(run_id, after=got[-1])) == []


# -- one permission asker ----------------------------------------------------------------------


def test_the_endpoint_asks_through_the_same_records_a_producer_answers(world: World) -> None:
    """An MCP call asked about by the run's endpoint is the same durable request as a
    harness's own: listed as pending, answered by ``approve`` (first answer wins)."""
    from worker.observe.masking import Masker
    from worker.tools.asking import EndpointAsk

    deps = world.deps
    run_id = world.new_run()
    published: list[Any] = []
    asker = EndpointAsk(
        deps.redis, deps.keys, run_id, 1, timeout_s=30, masker=Masker(), put=published.append
    )
    told: dict[str, str | None] = {}
    call = threading.Thread(
        target=lambda: told.update(said=asker("files", "read", {"path": "/etc/hosts"}))
    )
    call.start()
    deadline = time.monotonic() + 10
    while not (waiting := permissions.pending(deps.redis, deps.keys, run_id)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert waiting[0]["tool"] == "mcp__files__read" and waiting[0]["turn"] == 1
    world.client.approve(run_id, waiting[0]["request_id"], by="tester")
    call.join(10)
    assert told == {"said": None}  # allowed
    assert [e.type for e in published] == ["permission-request", "permission-decision"]
    assert published[-1].by == "tester"
    assert permissions.pending(deps.redis, deps.keys, run_id) == []


# -- the turn's worker still publishing after another ended its turn ---------------------------


@pytest.mark.parametrize("batch", [1, 5, 15], ids=lambda n: f"{n} events")
def test_a_workers_events_after_the_runs_end_wrote_its_terminal_never_follow_it(
    world: World, batch: int
) -> None:
    """``harness end`` while a turn runs writes the turn's terminal at once (end_run.lua); the
    worker, not yet told, still sends what its harness printed, as pipelined XADDs. A pipeline
    goes on past a refused XADD: with the terminal at the next seq, the second event of the
    batch and every later one were stored after it."""
    deps = world.deps
    run_id = world.new_run()
    life = TurnLife(deps, run_id, 1, "stdio-json")
    assert life.claim("w1")
    try:
        publisher = RedisStreamPublisher(
            deps.redis, deps.keys, run_id, 1, maxlen=deps.settings.stream_maxlen
        )
        publisher.publish([TurnStarted(harness="stdio-json", attempt=1, input_chars=1)])
        publisher.publish([AssistantText(text="before the end")])
        assert publisher.flush(force=True)
        world.client.end(run_id, timeout=0.2)
        publisher.publish([AssistantText(text=f"late {i}") for i in range(batch)])
        publisher.flush(force=True)
    finally:
        life.release()
    entries = _entries(deps, run_id, 1)
    assert entries[-1][1] == "session-error", entries
    assert [kind for _, kind in entries].count("assistant-text") == 1, entries
    assert publisher.superseded and publisher.dropped == batch
