"""Firing due schedules: every worker looks for due schedules every HARNESS_SCHEDULE_TICK_S
(:func:`start_timer`, a thread of its own, started with the worker), so a schedule fires
within a second or so of its time while any worker runs; the claim of each tick
(:meth:`Schedules.claim`) makes it fire once, whichever workers see it due.

A schedule due more than one period ago (no worker ran at its time, or several ticks went by)
fires once, late, and its next time is counted from now: never once per missed tick.

A firing fails when its run cannot be created (the operator's policy refuses it now, a budget)
or when the run it started failed at once: its first turn ended with a ``session-error``, or
its record is ``failed`` (seen at the next firing). HARNESS_SCHEDULE_MAX_FAILURES failures in
a row pause the schedule, ``paused_reason`` saying why; ``resume`` forgets them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from worker.deps import TurnDeps
from worker.schedules import cron
from worker.schedules.start import start_run
from worker.schedules.store import Schedule, Schedules
from worker.store.errors import REDIS_ERRORS

log = logging.getLogger(__name__)

StartRun = Callable[[TurnDeps, Schedule], str]
DUE_BATCH = 100
"""The most schedules one pass fires (the rest are due at the next tick)."""
_TURN_ONE_END = "1-18446744073709551615"


def schedules_of(deps: TurnDeps) -> Schedules:
    settings = deps.settings
    return Schedules(
        deps.redis,
        deps.keys,
        history_max=settings.schedule_history,
        retention_s=settings.retention_s,
    )


def start_timer(deps: TurnDeps) -> threading.Event:
    """Fire what is due now and then every HARNESS_SCHEDULE_TICK_S, until the event is set
    (the worker's shutdown). One cheap read of the due set per tick when nothing is due."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(deps.settings.schedule_tick_s):
            fire_due(deps)

    threading.Thread(target=loop, name="schedules", daemon=True).start()
    return stop


def fire_due(deps: TurnDeps, *, now: float | None = None, start: StartRun = start_run) -> list[str]:
    """Fire every schedule due at ``now``; what was fired, as lines. Never raises: Redis
    away, the next tick tries again."""
    fired: list[str] = []
    try:
        schedules = schedules_of(deps)
        at = time.time() if now is None else now
        for owned_name, tick in schedules.due(at, DUE_BATCH):
            try:
                line = fire(deps, schedules, owned_name, tick, at, start)
            except REDIS_ERRORS:
                raise
            except Exception:
                log.exception("schedule.fire_failed", extra={"schedule": owned_name})
                continue
            if line:
                fired.append(line)
    except Exception as exc:  # noqa: BLE001 -- Redis away: the next tick fires what is due
        log.warning("schedule.pass_failed", extra={"error": str(exc)})
    for line in fired:
        log.info("schedule.fired", extra={"done": line})
    return fired


def fire(
    deps: TurnDeps,
    schedules: Schedules,
    owned_name: str,
    tick: int,
    now: float,
    start: StartRun = start_run,
) -> str | None:
    """Fire ``tick`` of one schedule if this caller claims it; a line saying what it did."""
    found = schedules.find_owned(owned_name)
    if found is None:  # removed while due
        deps.redis.execute_command("ZREM", deps.keys.schedules_due(), owned_name)
        return None
    schedule, state = found
    next_at = cron.next_after(schedule.cron, schedule.tz, max(now, tick))
    if not schedules.claim(schedule, tick, next_at):
        return None
    entry: dict[str, Any] = {"tick": tick, "fired_at": now}
    if cron.next_after(schedule.cron, schedule.tz, tick) <= now:
        entry["missed"] = True  # a later tick passed too: fired once for all of them
    failures = int(state.get("failures") or 0)
    judged = state.get("judge_run_id") or ""  # the run the last firing started
    failed_before = _run_failed(deps, judged)
    if failed_before is not None:
        failures += 1
    elif judged:
        failures = 0
    error = failed_before
    limit = deps.settings.schedule_max_failures
    run_id = ""
    if failures < limit:
        try:
            run_id = start(deps, schedule)
        except REDIS_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 -- a refusal is the firing's result
            error = str(exc)[:500] or exc.__class__.__name__
            failures += 1
    if run_id:
        entry["run_id"] = run_id
    else:
        entry["error"] = error or "not started"
    schedules.fired(
        schedule,
        entry,
        {
            "failures": failures,
            "next_at": next_at,
            "last_fired_at": now,
            "last_run_id": run_id,
            "judge_run_id": run_id,
            "last_error": "" if run_id else entry["error"],
        },
    )
    if failures >= limit:
        reason = (
            f"{failures} firings in a row failed (HARNESS_SCHEDULE_MAX_FAILURES={limit}); "
            f"the last: {error}"
        )
        schedules.set_paused(schedule.owned, reason)
        log.warning("schedule.paused", extra={"schedule": owned_name, "reason": reason})
    what = f"run {run_id}" if run_id else f"no run ({entry['error']})"
    return f"schedule {owned_name} fired tick {tick}: {what}"


def _run_failed(deps: TurnDeps, run_id: str) -> str | None:
    """Why the run a former firing started failed at once (its record ``failed``, or its first
    turn's end a ``session-error``), or None: it did not, or it is gone or still running."""
    if not run_id:
        return None
    record = deps.store.find(run_id)
    if record is None:
        return None
    if record.status == "failed":
        return f"run {run_id} failed: {record.last_error or 'no reason given'}"[:500]
    last = deps.redis.xrevrange(deps.keys.events(run_id), _TURN_ONE_END, "1-0", count=1)
    if not last or last[0][1].get("type") != "session-error":
        return None
    data = json.loads(last[0][1].get("data") or "{}")
    why = f"{data.get('reason')}: {data.get('error')}" if isinstance(data, dict) else "failed"
    return f"run {run_id}'s first turn failed: {why}"[:500]
