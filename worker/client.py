"""HarnessClient: the producer's Python API (CONTRACT.md, "Python API for producers").

Every method raises the typed errors of :mod:`worker.errors`, never Redis' or Celery's.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from adapters.events import TERMINAL_TYPES, session_error
from config import Settings, load_settings
from worker import credentials, hosts
from worker.app import create_app
from worker.app_names import TASK_END_RUN, TASK_RUN_TURN, harness_queue
from worker.errors import HarnessError, InvalidInput, RunNotFound, Unavailable
from worker.keys import Keys, SyncRedis
from worker.lifecycle import fail_stranded_turn
from worker.policy import check_input, resolve
from worker.records import IN_FLIGHT, RunStore
from worker.runtime import redis_client
from worker.spec import TurnPayload, check_run_id, new_run_id, parse_options
from worker.turn import end_turn_without_harness

_ENTRY_ID = re.compile(r"[0-9]{1,19}-[0-9]{1,20}")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class StreamEvent:
    """One entry of a run's stream."""

    id: str
    type: str
    data: dict[str, Any]
    ts: float

    @property
    def turn(self) -> int:
        return int(self.id.split("-")[0])

    @property
    def seq(self) -> int:
        return int(self.id.split("-")[1])

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_TYPES

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "data": self.data, "ts": self.ts}


def _translate(fn: Callable[P, R]) -> Callable[P, R]:
    """Foreign errors become ours at the seam."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except HarnessError:
            raise
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unavailable(f"cannot reach Redis: {exc}") from exc
        except OperationalError as exc:
            raise Unavailable(f"cannot reach the broker: {exc}") from exc

    return wrapper


class HarnessClient:
    """Start runs, submit turns, read events, cancel and end runs."""

    def __init__(self, settings: Settings | None = None, *, celery_app: Celery | None = None):
        self.settings = settings or load_settings()
        self.keys = Keys(self.settings.key_prefix)
        self.redis: SyncRedis = redis_client(self.settings)
        self.store = RunStore(self.redis, self.keys, self.settings.retention_s)
        self._app = celery_app

    @classmethod
    def from_url(cls, redis_url: str, **settings: Any) -> HarnessClient:
        return cls(load_settings(redis_url=redis_url, **settings))

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = create_app(self.settings)
        return self._app

    def close(self) -> None:
        self.redis.close()

    # -- runs and turns -------------------------------------------------------------------

    @_translate
    def start_run(self, harness: str, input: str, **options: Any) -> str:
        """Create a run and enqueue its first turn; returns the run id.

        ``options`` are those of ``harness run``: model, system_prompt, posture, allow, deny,
        grants, sandbox, image, network, resume_session, base_url, executable, timeout_s,
        workspace. Refused with InvalidInput (nothing created) when invalid or beyond policy.
        """
        for name in ("allow", "deny", "grants"):
            value = options.get(name)
            if value is None:
                continue
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidInput(f"invalid request: {name}: expected a list of strings")
            options[name] = tuple(value)
        run_options = parse_options(
            harness=harness, **{k: v for k, v in options.items() if v is not None}
        )
        resolved = resolve(run_options, self.settings)
        check_input(input, self.settings)
        run_id = new_run_id()
        queue = harness_queue(harness, self.settings.key_prefix)
        self.store.create(run_id, run_options, queue=queue, sandbox=resolved.sandbox)
        self._send(run_id, 1, input, queue)
        return run_id

    @_translate
    def submit_turn(self, run_id: str, input: str) -> int:
        """Enqueue the run's next turn; returns its number. RunBusy while one is in flight."""
        check_run_id(run_id)
        check_input(input, self.settings)
        turn = self.store.begin_turn(run_id)
        raw = self.store.raw(run_id)
        harness = raw.get("harness", "")
        queue = raw.get("queue") or harness_queue(harness, self.settings.key_prefix)
        if hosts.is_host_queue(queue, self.keys) and not hosts.alive(self.redis, self.keys, queue):
            # The run's container is on a host with no live worker: waiting would be forever.
            fail_stranded_turn(
                self.redis, self.keys, self.store, self.settings, run_id, turn, harness, queue
            )
            return turn
        self._send(run_id, turn, input, queue)
        return turn

    def _send(self, run_id: str, turn: int, input: str, queue: str) -> None:
        payload = TurnPayload(run_id=run_id, turn=turn, input=input).model_dump()
        ttl = self.settings.retention_s
        entry = json.dumps({"payload": payload, "queue": queue, "sent_at": time.time()})
        self.redis.set(self.keys.turn_queued(run_id, turn), entry, ex=ttl)
        try:
            self.app.send_task(TASK_RUN_TURN, args=[payload], queue=queue)
        except Exception:
            # Nothing will run this turn: do not leave the run looking busy.
            self.store.update(run_id, status="idle" if turn > 1 else "failed")
            raise

    # -- reading ----------------------------------------------------------------------------

    @_translate
    def status(self, run_id: str) -> dict[str, Any]:
        check_run_id(run_id)
        record = self.store.get(run_id)
        record["credential_live"] = bool(self.redis.exists(self.keys.credential(run_id)))
        return record

    @_translate
    def events(
        self,
        run_id: str,
        after: str | None = None,
        follow: bool = False,
        *,
        until_terminal_of: int | None = None,
        timeout: float | None = None,
        block_ms: int = 1000,
    ) -> Iterator[StreamEvent]:
        """The run's events, oldest first, after the id ``after``.

        With ``follow`` waits for new ones: forever, until ``timeout`` seconds pass, or until
        the terminal event of turn ``until_terminal_of``.
        """
        check_run_id(run_id)
        if after is not None and not _ENTRY_ID.fullmatch(after):
            raise InvalidInput(f"invalid event id {after[:80]!r}: expected TURN-SEQ, like 3-0")
        if not self.redis.exists(self.keys.run(run_id)) and not self.redis.exists(
            self.keys.events(run_id)
        ):
            raise RunNotFound(run_id)
        key = self.keys.events(run_id)
        cursor = after or "0-0"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if follow:
                wait = block_ms
                if deadline is not None:
                    wait = max(1, min(block_ms, int((deadline - time.monotonic()) * 1000)))
                reply = self.redis.xread({key: cursor}, count=1000, block=wait)
                entries = reply[0][1] if reply else []
            else:
                entries = self.redis.xrange(
                    key, min=f"({cursor}" if cursor != "0-0" else "-", count=1000
                )
            for entry_id, fields in entries:
                cursor = entry_id
                event = StreamEvent(
                    entry_id, fields["type"], json.loads(fields["data"]), float(fields["ts"])
                )
                yield event
                if (
                    until_terminal_of is not None
                    and event.terminal
                    and event.turn == until_terminal_of
                ):
                    return
            if not follow and len(entries) < 1000:
                return
            if deadline is not None and time.monotonic() >= deadline:
                return

    @_translate
    def wait(self, run_id: str, turn: int, timeout: float | None = None) -> StreamEvent:
        """Block until the turn's terminal event and return it."""
        after = "0-0" if turn <= 1 else f"{turn - 1}-18446744073709551615"
        for event in self.events(
            run_id, after=after, follow=True, until_terminal_of=turn, timeout=timeout
        ):
            if event.terminal and event.turn == turn:
                return event
        raise TimeoutError(f"turn {turn} of run {run_id} did not end within {timeout}s")

    # -- stopping ---------------------------------------------------------------------------

    @_translate
    def cancel(self, run_id: str) -> bool:
        """Stop the in-flight turn. False when nothing is in flight."""
        check_run_id(run_id)
        record = self.store.get(run_id)
        if record["status"] not in IN_FLIGHT or not record.get("current_turn"):
            return False
        turn = int(record["current_turn"])
        ttl = self.settings.retention_s + self.settings.run_lease_s
        self.redis.set(self.keys.cancel(run_id, turn), "1", ex=ttl)
        # A turn still in the queue: claim it so no worker runs it, and end it here.
        if self.redis.set(self.keys.turn_started(run_id, turn), "client-cancel", nx=True, ex=ttl):
            end_turn_without_harness(
                self.redis,
                self.keys,
                self.store,
                self.settings.stream_maxlen,
                run_id,
                turn,
                record["harness"],
                session_error("the turn was cancelled before it started", "cancelled"),
                run_status="idle",
                drain_s=30,
            )
        return True

    @_translate
    def end(self, run_id: str, *, wait: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        """Tear the run down (process, container, workspace per scope, credential). Idempotent."""
        check_run_id(run_id)
        record = self.store.get(run_id)
        if record["status"] == "ended":
            return record
        if record["status"] in IN_FLIGHT:
            self.cancel(run_id)
        queue = record.get("queue") or harness_queue(record["harness"], self.settings.key_prefix)
        self.app.send_task(TASK_END_RUN, args=[run_id], queue=queue)
        if not wait:
            return record
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.store.get(run_id)
            if record["status"] == "ended":
                return record
            time.sleep(0.1)
        # No worker on the run's host answered in time (gone, or the message is held by a
        # dead one). The run ends here all the same: its credential now, and its sandbox at
        # the reaper's next pass on that host (an ended run's sandbox is always removed).
        credentials.revoke(self.redis, self.keys, run_id)
        note = (
            f"end: no worker consuming {queue} confirmed the teardown within {timeout:g}s; "
            "the reaper removes the sandbox on its next pass"
        )
        self.store.update(run_id, status="ended", last_error=note)
        self.store.expire(run_id, self.settings.retention_s)
        return self.store.get(run_id)
