"""A schedule's run, started from a worker: what ``HarnessClient.create_run`` does, from the
pieces below the client (the worker cannot import it), as an outcome's grader does
(worker/outcomes/grader.py).

The options were checked in full, the tenant's policy included, when the schedule was added;
the operator's policy is applied again here (it may have changed since)."""

from __future__ import annotations

import logging
import time

from worker.deps import TurnDeps
from worker.options.policy import check_input, check_schema, resolve
from worker.options.spec import RunOptions, TurnPayload, new_run_id
from worker.schedules.store import SCHEDULE_LABEL, Schedule
from worker.spend import budgets
from worker.store.queued import QueuedTurn
from worker.tools import turn as turn_tools

log = logging.getLogger(__name__)


def start_run(deps: TurnDeps, schedule: Schedule) -> str:
    """Create the schedule's run and send its first turn; its run id. InvalidInput (nothing
    created) when the operator's policy refuses it now."""
    settings, keys = deps.settings, deps.keys
    options = RunOptions.model_validate({**schedule.options, "harness": schedule.harness})
    resolved = resolve(options, settings)
    turn_tools.check(options, settings)
    check_input(schedule.input, settings)
    check_schema(options.output_schema, settings)
    run_id = new_run_id()
    queue = f"{keys.prefix}.{options.harness}"  # worker.app_names.harness_queue
    deps.store.create(
        run_id,
        options,
        queue=queue,
        sandbox=resolved.sandbox,
        budget=budgets.initial(options, settings),
        labels={**schedule.labels, SCHEDULE_LABEL: schedule.name},
        tenant=schedule.tenant,
        webhook_url=schedule.webhook_url,
        warnings=list(resolved.warnings),
    )
    if schedule.watch:
        deps.redis.sadd(keys.webhooks("runs"), run_id)  # the API's dispatcher delivers them
    payload = TurnPayload(run_id=run_id, turn=1, input=schedule.input).model_dump()
    QueuedTurn.first(payload, queue, time.time()).write(
        deps.redis, keys, run_id, 1, settings.retention_s
    )
    try:
        deps.send_turn(payload, queue, 0.0)
    except Exception:  # the queued entry stays: the reaper sends it again
        log.exception("schedule.send_failed", extra={"run_id": run_id, "schedule": schedule.name})
    return run_id
