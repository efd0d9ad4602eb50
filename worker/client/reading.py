"""Reading a run: its events (listed, followed to a turn's or the run's end, waited for) and
the notices a follower is given on the way (a turn no worker takes: :class:`Waiting`).

:class:`RunReader` is :class:`~worker.client.HarnessClient`'s reading side; its iterators
raise the typed errors of :mod:`worker.errors` on every ``next()`` (a Redis outage is
:class:`~worker.errors.Unavailable`: resume with ``after=`` the last id seen).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from adapters.events import TERMINAL_TYPES
from config import Settings
from worker.app_names import harness_queue
from worker.client.translate import translate, translate_iter
from worker.errors import RunNotFound, StreamLost, TurnWaitTimeout
from worker.fleet import hosts
from worker.options.spec import check_run_id
from worker.spend import slots
from worker.store import stream_end
from worker.store.event_ids import LAST, parse_event_id
from worker.store.keys import Keys, SyncRedis
from worker.store.records import RunStore
from worker.store.status import EXECUTING
from worker.turn.stall import read_report

CHECK_EVERY_S = 1.0
"""How often a follow that sees no event of its turn looks whether a worker took it (so a
turn no worker consumes is said to wait within a second or two)."""


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


def after_previous_turn(turn: int) -> str:
    """The stream id just before turn ``turn``'s first event."""
    return "0-0" if turn <= 1 else f"{turn - 1}-18446744073709551615"


def entry(entry_id: str, fields: dict[str, str]) -> StreamEvent:
    return StreamEvent(entry_id, fields["type"], json.loads(fields["data"]), float(fields["ts"]))


@dataclass(frozen=True)
class Waiting:
    """A notice: turn ``turn`` is queued on ``queue`` and no live worker consumes that queue.

    ``since`` is when the turn was sent (unix time; None when unknown). ``bound_s`` is how
    long such a turn waits before the reaper ends it (a later turn bound to its run's host:
    ``HARNESS_HOST_WAIT_S``, then a ``sandbox`` error and the run stays usable); None when
    it waits until a worker comes (a harness queue).
    """

    run_id: str
    turn: int
    queue: str
    since: float | None
    bound_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "notice": "waiting",
            "for": "turn",
            "run_id": self.run_id,
            "turn": self.turn,
            "queue": self.queue,
            "since": self.since,
            "bound_s": self.bound_s,
        }


class RunReader:
    """A run's events and the notices on the way, from Redis."""

    def __init__(self, settings: Settings, redis: SyncRedis, keys: Keys, store: RunStore):
        self.settings, self.redis, self.keys, self.store = settings, redis, keys, store

    def silent(self, run_id: str, record: dict[str, Any]) -> dict[str, Any] | None:
        """What the current turn's harness was doing when it had been silent for long."""
        turn = record.get("current_turn")
        if record.get("status") not in EXECUTING or not turn:
            return None
        return read_report(self.redis, self.keys, run_id, int(turn))

    def waiting_for(self, run_id: str, record: dict[str, Any]) -> Waiting | None:
        turn = record.get("current_turn")
        if record.get("status") not in EXECUTING or not turn:
            return None
        if self.redis.exists(self.keys.turn_started(run_id, turn)):
            return None
        queue = record.get("queue") or harness_queue(record["harness"], self.settings.key_prefix)
        if hosts.alive(self.redis, self.keys, queue):
            return None
        since = self.store.queued_since(run_id, turn) or record.get("updated_at")
        bound = None
        if hosts.is_host_queue(queue, self.keys):
            bound = float(self.settings.host_wait_s)
        return Waiting(run_id, int(turn), queue, since, bound)

    @translate_iter
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
        the terminal event of turn ``until_terminal_of``. Raises, when iterated, RunNotFound
        or InvalidInput first, Unavailable whenever Redis fails (resume after the last id
        seen), and StreamLost when a followed run is gone from Redis (every event it had is
        read first: :func:`worker.store.stream_end.lost`).
        """
        key = self._events_key(run_id, after)
        cursor = after or "0-0"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if follow:
                wait = block_ms
                if deadline is not None:
                    wait = max(1, min(block_ms, int((deadline - time.monotonic()) * 1000)))
                reply = self.redis.xread({key: cursor}, count=1000, block=wait)
                entries = reply[0][1] if reply else []
            elif parse_event_id(cursor) == LAST:
                entries = []
            else:
                entries = self.redis.xrange(
                    key, min=f"({cursor}" if cursor != "0-0" else "-", count=1000
                )
            for entry_id, fields in entries:
                cursor = entry_id
                event = entry(entry_id, fields)
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
            if not entries:
                self._stop_if_lost(run_id, cursor)

    def _events_key(self, run_id: str, after: str | None) -> str:
        """The run's stream; RunNotFound when neither it nor the record is there, StreamLost
        when a read resumes ``after`` an event of a run that is gone since."""
        check_run_id(run_id)
        if after is not None:
            parse_event_id(after)
        if not self.redis.exists(self.keys.run(run_id)) and not self.redis.exists(
            self.keys.events(run_id)
        ):
            if after is not None and after != stream_end.START:
                raise StreamLost(run_id)
            raise RunNotFound(run_id)
        return self.keys.events(run_id)

    def _stop_if_lost(self, run_id: str, cursor: str) -> None:
        """StreamLost once the run is lost and every event it had is read (a follower that
        saw nothing new looks: one read of the record's status and the stream's end)."""
        end, lost = stream_end.read_end(self.redis, self.keys, run_id)
        if lost and end is not None and stream_end.reached(cursor, end):
            raise StreamLost(run_id)

    @translate_iter
    def follow_run(
        self, run_id: str, after: str | None = None, *, block_ms: int = 1000
    ) -> Iterator[StreamEvent]:
        """The run's events after ``after`` as they come, until its stream has ended: the
        run is ended or failed (or gone) and every event it has is read, the last turn's
        terminal included (:mod:`worker.store.stream_end`; no grace period). Raises, when
        iterated, RunNotFound or InvalidInput first, Unavailable whenever Redis fails
        (resume after the last id seen), and StreamLost, once every event it had is read,
        when the run is gone from Redis without an end (:func:`stream_end.lost`)."""
        key = self._events_key(run_id, after)
        cursor = after or stream_end.START
        while True:
            end, lost = stream_end.read_end(self.redis, self.keys, run_id)
            block = None if end is not None else block_ms
            reply = self.redis.xread({key: cursor}, count=1000, block=block)
            entries = reply[0][1] if reply else []
            for entry_id, fields in entries:
                cursor = entry_id
                yield entry(entry_id, fields)
            if end is not None and (not entries or stream_end.reached(cursor, end)):
                if lost:
                    raise StreamLost(run_id)
                return

    @translate_iter
    def follow(
        self,
        run_id: str,
        turn: int,
        *,
        after: str | None = None,
        wait: float | None = None,
        block_ms: int = 1000,
    ) -> Iterator[StreamEvent | Waiting | slots.SlotWaiting]:
        """Turn ``turn``'s events as they come, up to its terminal event, with a notice.

        Yields the events after ``after`` (default: the turn's first), and once, within a
        second or two, a :class:`Waiting` notice if the turn is queued where no live worker
        consumes it; it keeps waiting for one. ``wait`` bounds how long the turn may take to
        start: past it raises TurnWaitTimeout, and the turn stays queued (cancel it to
        withdraw it). Once the turn has started there is no bound here (the turn has its own
        timeout). Unavailable when Redis fails: call again with ``after`` the last event id.
        StreamLost when the run is gone from Redis before the turn's terminal (lost data).
        """
        key = self._events_key(run_id, after)
        cursor = after or after_previous_turn(turn)
        began = time.monotonic()
        started, noticed = False, False
        slot_place: int | None = None
        next_check = began + CHECK_EVERY_S
        while True:
            block = block_ms
            if not started:
                block = max(1, min(block_ms, int((next_check - time.monotonic()) * 1000)))
                if wait is not None:
                    left = int((began + wait - time.monotonic()) * 1000)
                    block = max(1, min(block, left))
            reply = self.redis.xread({key: cursor}, count=1000, block=block)
            for entry_id, fields in reply[0][1] if reply else []:
                cursor = entry_id
                event = entry(entry_id, fields)
                started = started or event.turn >= turn
                yield event
                if event.terminal and event.turn == turn:
                    return
            if not reply:
                self._stop_if_lost(run_id, cursor)
            now = time.monotonic()
            if started or (now < next_check and (wait is None or now < began + wait)):
                continue
            next_check = now + CHECK_EVERY_S
            if self.redis.exists(self.keys.turn_started(run_id, turn)):
                started = True
                continue
            record = self.store.get(run_id)
            waiting = self.waiting_for(run_id, record)
            if wait is not None and now >= began + wait:
                raise TurnWaitTimeout(run_id, turn, self._gave_up(run_id, turn, wait, waiting))
            if waiting is not None and not noticed:
                noticed = True
                yield waiting
            slot = slots.waiting_notice(run_id, record) if record.get("slot_wait") else None
            if slot is not None and slot.turn == turn and slot.place != slot_place:
                slot_place = slot.place  # said again when its place changes
                yield slot

    def _gave_up(self, run_id: str, turn: int, wait: float, waiting: Waiting | None) -> str:
        text = f"no worker started turn {turn} of run {run_id} within {wait:.3g}s"
        if waiting is not None:
            text += f" (no live worker consumes its queue {waiting.queue})"
        return text + "; the turn stays queued"

    @translate
    def wait(self, run_id: str, turn: int, timeout: float | None = None) -> StreamEvent:
        """Block until the turn's terminal event and return it.

        TurnWaitTimeout (a TimeoutError) when ``timeout`` seconds pass first; the turn goes on.
        StreamLost when the run is gone from Redis (lost data) before the turn ended.
        """
        for event in self.events(
            run_id,
            after=after_previous_turn(turn),
            follow=True,
            until_terminal_of=turn,
            timeout=timeout,
        ):
            if event.terminal and event.turn == turn:
                return event
        raise TurnWaitTimeout(
            run_id, turn, f"turn {turn} of run {run_id} did not end within {timeout:g}s"
        )
