"""HarnessClient: the producer's Python API (README.md, "Using it"; docs/events.md,
"Reading events").

Every method raises the typed errors of :mod:`worker.errors`, never Redis' or Celery's; the
iterators (:meth:`HarnessClient.events`, :meth:`HarnessClient.follow`) too, on every
``next()``: a Redis outage while iterating is :class:`~worker.errors.Unavailable`, after
which a caller resumes with ``after=`` the last id it saw (no gap, no duplicate).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from celery import Celery

from adapters.events import session_error
from config import Settings, SettingsError, load_settings
from worker.app import create_producer_app, turn_sender
from worker.app_names import TASK_END_RUN, harness_queue
from worker.client.attempts import Attempts
from worker.client.forks import Forks
from worker.client.reading import RunReader, Waiting
from worker.client.runs import RunStarts
from worker.client.schedules import ScheduleRequests
from worker.client.steering import Steering
from worker.client.translate import translate
from worker.client.triggers import Triggers
from worker.client.workspace import WorkspaceRequests
from worker.control import cancel as cancels
from worker.errors import (
    InvalidInput,
    InvalidSettings,
)
from worker.fleet import hosts
from worker.observe import tracing
from worker.options.spec import (
    SERVER_NAME,
    check_labels,
    check_run_id,
)
from worker.options.tenant_names import check_tenant
from worker.permissions import requests as permissions
from worker.permissions.requests import who
from worker.schedules.store import Schedules
from worker.spend import budgets, slots
from worker.store import credentials, idempotency
from worker.store.keys import Keys, SyncRedis
from worker.store.listing import RunFilter
from worker.store.records import Lineage, RunStore
from worker.store.redis_client import redis_client
from worker.store.status import IN_FLIGHT, RunStatus
from worker.store.terminal import TurnRef, end_unclaimed_turn
from worker.tools import calls as tool_calls
from worker.tools.schema import tool_set

END_NOTICE_AFTER_S = 1.0
"""A live worker tears a run down well within this; past it ``end`` says what it waits for."""


def _settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        raise InvalidSettings(str(exc)) from None


class HarnessClient:
    """Start runs, submit turns, read events, cancel and end runs."""

    def __init__(self, settings: Settings | None = None, *, celery_app: Celery | None = None):
        """InvalidSettings when the settings (HARNESS_* variables) are not valid, a
        HARNESS_REDIS_URL that is not a Redis URL included."""
        self.settings = settings or _settings()
        tracing.setup("harness-client")  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
        self.keys = Keys(self.settings.key_prefix)
        self.redis: SyncRedis = redis_client(self.settings)
        self.store = RunStore(self.redis, self.keys, self.settings.retention_s)
        self.reading = RunReader(self.settings, self.redis, self.keys, self.store)
        # Reading a run (docs/events.md, "Reading events"): RunReader's, named here.
        self.events = self.reading.events
        self.follow_run = self.reading.follow_run
        self.follow = self.reading.follow
        self.wait = self.reading.wait
        # Work out of a run (docs/events.md, "Work in and out"): the workspace requests'.
        self.workspace = WorkspaceRequests(
            self.settings, self.keys, self.redis, self.store, lambda: self.app
        )
        self.diff = self.workspace.diff
        self.export = self.workspace.export
        self.rewind = self.workspace.rewind
        # Schedules (docs/api.md, "Schedules"): runs the workers start on a cron.
        self.schedules = ScheduleRequests(self.settings, Schedules(
            self.redis, self.keys, history_max=self.settings.schedule_history,
            retention_s=self.settings.retention_s,
        ))  # fmt: skip
        self.add_schedule = self.schedules.add
        self.list_schedules = self.schedules.listed
        self.get_schedule = self.schedules.get
        self.pause_schedule = self.schedules.pause
        self.resume_schedule = self.schedules.resume
        self.remove_schedule = self.schedules.remove
        self.schedule_history = self.schedules.history
        self._app = celery_app
        self._forks = Forks(
            self.redis, self.keys, self.store, self.workspace, self.create_run,
            self.settings.retention_s,
        )  # fmt: skip
        self._attempts = Attempts(
            self.settings,
            self.redis, self.keys, self.store, self.workspace, self.create_run,
            lambda run_id: self.reading.events(run_id), lambda run_id: self.end(run_id, wait=False),
            self.settings.retention_s,
        )  # fmt: skip
        # Runs and turns sent (worker/client/runs.py).
        self._runs = RunStarts(
            self.settings, self.redis, self.keys, self.store, self.workspace,
            lambda: turn_sender(self.app),
        )  # fmt: skip
        # Messages to a run (docs/events.md, "Messages to a run").
        self._steering = Steering(
            self.settings, self.redis, self.keys, self.store,
            lambda: turn_sender(self.app), self.cancel,
        )  # fmt: skip
        # Triggers (docs/api.md, "Triggers"): worker/client/triggers.py's, named here.
        self.triggers = Triggers(self.redis, self.keys, self.settings.retention_s)
        self.add_trigger = self.triggers.add
        self.list_triggers = self.triggers.listing
        self.remove_trigger = self.triggers.remove
        self.trigger_deliveries = self.triggers.deliveries

    @classmethod
    def from_url(cls, redis_url: str, **settings: Any) -> HarnessClient:
        return cls(_settings(redis_url=redis_url, **settings))

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = create_producer_app(self.settings)
        return self._app

    @functools.cached_property
    def idempotency_keys(self) -> idempotency.Idempotency:
        """Idempotency keys' first answers (``start_run``/``submit_turn``)."""
        return idempotency.Idempotency(self.redis, self.keys, self.settings.idempotency_ttl_s)

    def close(self) -> None:
        self.workspace.close()
        self.redis.close()

    @translate
    def ping(self) -> None:
        """Unavailable unless Redis answers."""
        self.redis.ping()

    # -- runs and turns -------------------------------------------------------------------

    @tracing.traced("HarnessClient.start_run")
    @translate
    def start_run(
        self, harness: str, input: str, *, idempotency_key: str | None = None, **options: Any
    ) -> str:
        """Create a run and enqueue its first turn; returns the run id.

        ``options`` are those of ``harness run``: model, system_prompt, posture, allow, deny,
        grants, sandbox, image, network, resume_session, base_url, fallback_models (the model
        gateway's, in turn, when the model fails), executable, timeout_s,
        workspace, repo, ref, push_branch, max_cost_usd, max_tokens, max_turns, max_wall_s
        (the run's budget, within the operator's ceilings), on_limit (``park`` or ``fail``),
        producer, ``labels`` (``{KEY: VALUE}``: :meth:`list_runs` finds runs by them),
        ``tenant`` and ``webhook_url`` (set by the HTTP API; the run's tool sets and durable
        workspace are then its tenant's own: :mod:`worker.options.tenant_names`),
        ``archive`` (a path: the archive is uploaded through Redis and unpacked into the
        workspace by the worker), ``attachments`` (file paths: the first turn's files, see
        :meth:`submit_turn`) and ``output_schema`` (a JSON Schema, as a dict, every turn's
        answer must meet). Refused with InvalidInput (nothing created) when invalid or beyond
        policy. ``idempotency_key``: the same key with the same request (within
        HARNESS_IDEMPOTENCY_TTL_S) returns the first call's run id and starts nothing
        (:mod:`worker.store.idempotency`: IdempotencyMismatch, IdempotencyInProgress).
        """
        if idempotency_key is not None:
            archive, attached = options.get("archive"), options.get("attachments") or ()
            files = {
                "archive": idempotency.file_digest(archive) if archive else None,
                "attachments": [idempotency.file_digest(path) for path in attached],
            }
            print_ = idempotency.fingerprint(
                "run", harness=harness, input=input, options={**options, **files}
            )
            return self.idempotency_keys.once(
                options.get("tenant"),
                idempotency_key,
                print_,
                lambda: self.start_run(harness, input, **options),
            )
        return self.create_run(harness, input, **options)

    def create_run(
        self,
        harness: str,
        input: str,
        *,
        lineage: Lineage | None = None,
        before_send: Callable[[str], None] | None = None,
        **options: Any,
    ) -> str:
        """:meth:`start_run` without its idempotency key, for the run's own makers (a fork,
        a group of attempts): ``lineage`` goes into the record, and ``before_send`` is called
        with the new run's id once it exists, before its first turn is sent."""
        return self._runs.create(
            harness, input, lineage=lineage, before_send=before_send, **options
        )

    @translate
    def list_runs(
        self,
        *,
        status: str | None = None,
        labels: dict[str, str] | None = None,
        harness: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """A page of runs, newest first: ``{"runs": [records], "cursor"}``, the cursor to
        pass for the next page (None after the last). Filters: the status, every label
        given, the harness. ``tenant``: that API tenant's runs (None: runs made without the
        API). Read from an index, never a scan of Redis' keys."""
        if status is not None and status not in get_args(RunStatus):
            known = ", ".join(get_args(RunStatus))
            raise InvalidInput(f"unknown status {status[:40]!r}: one of {known}")
        where = RunFilter(status=status, harness=harness, labels=check_labels(labels or {}))
        runs, after = self.store.list_runs(tenant=tenant, where=where, limit=limit, cursor=cursor)
        return {"runs": runs, "cursor": after}

    @tracing.traced("HarnessClient.submit_turn")
    @translate
    def submit_turn(
        self,
        run_id: str,
        input: str,
        *,
        attachments: list[str | Path] | None = None,
        output_schema: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Enqueue the run's next turn; returns its number. RunBusy while one is in flight.

        ``attachments``: file paths, read and checked here (HARNESS_ATTACH_MAX_BYTES,
        _MAX_FILES, _MAX_TOTAL_BYTES; an image is known by its bytes: a mislabeled or
        unreadable one is refused), uploaded through Redis and written by the worker into the
        workspace at ``.attachments/turn-N/NAME``. ``output_schema``: this turn's JSON Schema
        in place of the run's. InvalidInput (nothing sent) when either is refused.

        A turn for a host no live worker consumes is queued all the same: it waits there up to
        ``HARNESS_HOST_WAIT_S`` (see :meth:`waiting`), then the reaper ends it.

        ``idempotency_key``: as :meth:`start_run`'s, in the run's tenant's keys: a retry
        returns the first call's turn number and sends nothing.
        """
        check_run_id(run_id)
        if idempotency_key is not None:
            found = self.store.find(run_id)
            print_ = idempotency.fingerprint(
                "turn",
                run_id=run_id,
                input=input,
                attachments=[idempotency.file_digest(p) for p in attachments or ()],
                output_schema=output_schema,
            )
            return self.idempotency_keys.once(
                found.tenant if found else None,
                idempotency_key,
                print_,
                lambda: self.submit_turn(
                    run_id, input, attachments=attachments, output_schema=output_schema
                ),
            )
        return self._runs.submit(run_id, input, attachments, output_schema)

    @translate
    def set_budget(self, run_id: str, **limits: float | int | None) -> dict[str, Any]:
        """Change a run's budget (``max_cost_usd``, ``max_tokens``, ``max_turns``,
        ``max_wall_s``; 0 removes a limit, up to the operator's ceiling; a limit not named is
        kept) and return it: ``{"run_id", "budget", "spent", "exceeded"}``. Without limits,
        only returns it. InvalidInput above a ceiling. The next turn (not one in flight)
        runs under the new budget; raising a spent budget lets the run take turns again."""
        check_run_id(run_id)
        unknown = set(limits) - set(budgets.LIMITS)
        if unknown:
            raise InvalidInput(f"unknown budget limit(s): {', '.join(sorted(unknown))}")
        asked = {name: value for name, value in limits.items() if value is not None}
        record = self.store.record(run_id)
        if asked:
            budget = {**budgets.effective(record, self.settings)}
            budget.update(budgets.check(asked, self.settings))
            self.store.update(run_id, budget=budget)
            record = self.store.record(run_id)
            if record.budget_exceeded and budgets.submit_refusal(record, self.settings) is None:
                self.store.update(run_id, budget_exceeded=None)
                record = self.store.record(run_id)
        spent = budgets.spent(record)
        return {
            "run_id": run_id,
            "budget": budgets.effective(record, self.settings),
            "spent": {
                "cost_usd": spent.cost_usd,
                "tokens": spent.tokens,
                "turns": spent.turns,
                "wall_s": spent.wall_s,
            },
            "exceeded": record.budget_exceeded,
        }

    @translate
    def steer(
        self, run_id: str, text: str, *, mode: str = "queue", by: str | None = None
    ) -> dict[str, Any]:
        """Send a message to the run: ``mode`` ``queue`` (the next turn, once the one in
        flight ends), ``steer`` (into the running turn: the harness's own channel where its
        capability ``steering`` has one, else the turn is stopped and the message starts the
        next) or ``interrupt`` (the running turn stops as on cancel; the message starts the
        next turn in the same session). See :meth:`worker.client.steering.Steering.steer`."""
        return self._steering.steer(run_id, text, mode=mode, by=by)

    @tracing.traced("HarnessClient.fork")
    @translate
    def fork(
        self,
        run_id: str,
        input: str,
        *,
        at_turn: int | None = None,
        harness: str | None = None,
        **options: Any,
    ) -> str:
        """A new run whose workspace is run ``run_id``'s snapshot after turn ``at_turn``
        (default: its last finished turn) and whose conversation continues from there, its
        first turn started with ``input``; returns its id. ``harness`` and ``options`` (as
        :meth:`start_run`'s) change what it runs. See :mod:`worker.client.forks`."""
        return self._forks.fork(run_id, input, at_turn=at_turn, harness=harness, **options)

    @tracing.traced("HarnessClient.start_attempts")
    @translate
    def start_attempts(
        self,
        harness: str | list[str],
        input: str,
        *,
        attempts: int,
        model: str | list[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Start ``attempts`` runs of ``input`` side by side under one group; returns
        ``{"group", "runs"}``. ``harness`` and ``model`` may be lists (or ``"a,b"``) spread
        over the attempts, round robin; ``options`` are :meth:`start_run`'s. See
        :mod:`worker.client.attempts`."""
        return self._attempts.start(harness, input, attempts=attempts, model=model, **options)

    @translate
    def attempts(self, group: str, *, tenant: str | None = None) -> dict[str, Any]:
        """The group's attempts side by side: outcome, answer, structured result, diff stats,
        tokens, cost and wall time of each. RunNotFound for an unknown group or another
        tenant's."""
        return self._attempts.compare(group, tenant)

    @translate
    def attempts_diff(self, group: str, a: int, b: int, *, tenant: str | None = None) -> str:
        """A unified diff from attempt ``a``'s workspace to attempt ``b``'s."""
        return self._attempts.diff(group, a, b, tenant)

    @translate
    def pick(
        self,
        group: str,
        attempt: int,
        *,
        tenant: str | None = None,
        export_to: str | Path | None = None,
    ) -> dict[str, Any]:
        """Pick one attempt of the group (the others are ended; it goes on as a normal run,
        exported to ``export_to`` if given). The first pick wins (AnswerRefused for another
        one later)."""
        return self._attempts.pick(group, attempt, tenant=tenant, export_to=export_to)

    # -- reading ----------------------------------------------------------------------------

    @translate
    def status(self, run_id: str) -> dict[str, Any]:
        """The run record, typed, plus ``credential_live`` and ``waiting_for_worker`` (the
        :class:`Waiting` notice as a dict while its current turn waits for a worker, else
        None)."""
        check_run_id(run_id)
        record = self.store.get(run_id)
        record["credential_live"] = bool(self.redis.exists(self.keys.credential(run_id)))
        waiting = self.reading.waiting_for(run_id, record)
        record["waiting_for_worker"] = None if waiting is None else waiting.as_dict()
        slot = slots.waiting_notice(run_id, record)
        record["waiting_for_slot"] = None if slot is None else slot.as_dict()
        record["silent_turn"] = self.reading.silent(run_id, record)
        return record

    @translate
    def waiting(self, run_id: str) -> Waiting | None:
        """A :class:`Waiting` notice while the run's current turn is queued and no live worker
        consumes its queue; None otherwise (started, finished, or a worker is there)."""
        check_run_id(run_id)
        return self.reading.waiting_for(run_id, self.store.get(run_id))

    # -- permission requests (--posture ask; worker/permissions/requests.py) -----------------------

    @translate
    def pending(self, run_id: str) -> list[dict[str, Any]]:
        """The run's permission requests still waiting for an answer, oldest first: each
        with ``request_id``, ``turn``, ``tool``, ``description``, ``command``, ``input``
        (masked, cut), ``input_chars`` and ``deadline`` (unix time)."""
        check_run_id(run_id)
        self.store.get(run_id)  # RunNotFound
        return permissions.pending(self.redis, self.keys, run_id)

    @translate
    def serve_tools(
        self,
        name: str,
        handlers: object,
        *,
        tenant: str | None = None,
        stop: threading.Event | None = None,
        lease_s: float = tool_calls.DEFAULT_LEASE_S,
        concurrency: int = tool_calls.DEFAULT_CONCURRENCY,
    ) -> None:
        """Answer the calls of tool set ``name`` for every run that attached it
        (``start_run(..., tools=[name])``, ``--tools NAME``); blocks until ``stop`` is set.

        ``tenant``: the set is that API tenant's own, attached by its runs only (a platform
        serving each tenant its own handlers). Without it: the set of runs made without a
        tenant, and of every tenant's runs when the operator shares the name
        (HARNESS_SHARED_TOOL_SETS); a tenant's runs never reach it otherwise
        (:mod:`worker.options.tenant_names`).

        ``handlers`` is a function, a list of functions or a ``{tool name: function}``
        mapping: each one's typed parameters give its tool's JSON Schema and its docstring
        the description (:func:`worker.tools.schema.tool` takes an explicit schema). What a
        handler returns is the result (a string as it is, anything else as JSON); what it
        raises is the error result the harness gets (its text, never a traceback). Up to
        ``concurrency`` calls run at once, each handler on a thread of its own (handlers
        must be thread-safe); a call is taken only when one is free. Several servers of one
        set share its calls; a call whose server dies is taken by another once ``lease_s``
        passes. Refused with InvalidInput (a bad name or tenant, a shared set named with a
        tenant, a handler without types, a concurrency outside 1 to 256); rides out Redis
        being away; once ``stop`` is set, the calls under way are answered before it
        returns."""
        if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
            raise InvalidInput(
                f"invalid tool set name {name!r}: 1 to 32 letters, digits, '_' or '-'"
            )
        if tenant is not None:
            check_tenant(tenant)
            if name in self.settings.shared_tool_sets:
                raise InvalidInput(
                    f"tool set {name} is shared with every tenant (HARNESS_SHARED_TOOL_SETS): "
                    "serve it without a tenant"
                )
        try:
            tools = tool_set(handlers)
            server = tool_calls.ToolServer(
                self.redis, self.keys, name, tools, tenant=tenant, lease_s=lease_s,
                concurrency=concurrency,
            )  # fmt: skip
        except ValueError as exc:
            raise InvalidInput(f"tool set {name}: {exc}") from None
        server.serve(stop)

    @translate
    def approve(
        self, run_id: str, request_id: str, *, always: bool = False, by: str | None = None
    ) -> dict[str, Any]:
        """Allow a waiting request (``always``: the same call again in this run is allowed
        without asking). The first answer wins: a request answered already, expired or
        closed raises :class:`AnswerRefused`, an unknown one :class:`RequestNotFound`."""
        check_run_id(run_id)
        self.store.get(run_id)
        return permissions.answer(
            self.redis, self.keys, run_id, request_id, allow=True, always=always, by=by or who()
        )

    @translate
    def deny(
        self, run_id: str, request_id: str, *, message: str | None = None, by: str | None = None
    ) -> dict[str, Any]:
        """Deny a waiting request; ``message`` is what the model is told. Refused as
        :meth:`approve` is."""
        check_run_id(run_id)
        self.store.get(run_id)
        return permissions.answer(
            self.redis, self.keys, run_id, request_id, allow=False, message=message, by=by or who()
        )

    # -- stopping ---------------------------------------------------------------------------

    @translate
    def cancel(self, run_id: str) -> bool:
        """Stop the in-flight turn. False when nothing is in flight."""
        check_run_id(run_id)
        record = self.store.get(run_id)
        # A parked run's current turn is queued until its reset: it is withdrawn as any other.
        if record["status"] not in IN_FLIGHT or not record.get("current_turn"):
            return False
        turn = int(record["current_turn"])
        ttl = self.settings.retention_s + self.settings.run_lease_s
        cancels.mark(self.redis, self.keys, run_id, turn, ttl)
        # A turn still in the queue ends here, and no worker can take it after; one a worker
        # holds is stopped by that worker, which sees the cancel mark.
        ref = TurnRef(
            self.redis, self.keys, self.store, self.settings, run_id, turn, record["harness"]
        )
        end_unclaimed_turn(
            ref,
            session_error("the turn was cancelled before it started", "cancelled"),
            caller="unclaimed",
        )
        return True

    @translate
    def end(
        self,
        run_id: str,
        *,
        wait: bool = True,
        timeout: float = 60.0,
        on_wait: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Tear the run down (process, container, workspace per scope, credential). Idempotent.

        From the moment this returns, with or without ``wait``, the run takes no more turns
        (:meth:`submit_turn` raises RunEnded): it is marked as ending before anything else,
        and a turn begun before the mark is cancelled here.

        With ``wait``, waits up to ``timeout`` seconds for a worker on the run's queue to
        confirm; past that the run is ended here (credential revoked, the sandbox left to the
        reaper) and ``last_error`` says so. ``on_wait`` is called once, if the teardown is not
        confirmed within a second, with a notice: ``{"notice": "waiting", "for": "teardown",
        "run_id", "queue", "alive" (a live worker consumes the queue), "timeout_s"}``.
        """
        check_run_id(run_id)
        if self.store.request_end(run_id) == "ended":
            return self.store.get(run_id)
        record = self.store.get(run_id)  # read after the mark: any turn begun is in it
        if record["status"] == "ended":
            return record
        if record["status"] in IN_FLIGHT:
            self.cancel(run_id)
        queue = record.get("queue") or harness_queue(record["harness"], self.settings.key_prefix)
        self.app.send_task(TASK_END_RUN, args=[run_id], queue=queue)
        if not wait:
            return record
        began = time.monotonic()
        deadline, noticed = began + timeout, on_wait is None
        while time.monotonic() < deadline:
            record = self.store.get(run_id)
            if record["status"] == "ended":
                return record
            if not noticed and time.monotonic() - began >= END_NOTICE_AFTER_S:
                noticed = True
                assert on_wait is not None
                on_wait(
                    {
                        "notice": "waiting",
                        "for": "teardown",
                        "run_id": run_id,
                        "queue": queue,
                        "alive": hosts.alive(self.redis, self.keys, queue),
                        "timeout_s": timeout,
                    }
                )
            time.sleep(0.1)
        # No worker on the run's host answered in time (gone, or the message is held by a
        # dead one). The run ends here all the same: its credential now, and its sandbox at
        # the reaper's next pass on that host (an ended run's sandbox is always removed).
        credentials.revoke(self.redis, self.keys, run_id)
        note = (
            f"end: no worker consuming {queue} confirmed the teardown within {timeout:g}s; "
            "the reaper removes the sandbox on its next pass"
        )
        self.store.end_run(run_id, last_error=note)
        self.store.expire(run_id, self.settings.retention_s)
        return self.store.get(run_id)
