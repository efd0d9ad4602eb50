"""Run records: the hash ``harness:run:{run_id}`` (docs/events.md, "The run record"), and beside it
the string ``harness:run:{run_id}:long`` for the fields of :data:`LONG_FIELDS`.

:class:`RunRecord` is the record, typed; its codec is the only code that turns its fields into
Redis strings and back, by each field's declared type. :class:`RecordChanges` names what a
write may change. :class:`RunStore` reads and writes records (its atomic steps are the Lua
scripts of :mod:`worker.store.lua`).
"""

from __future__ import annotations

import json
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field

from adapters.events import TurnStarted, session_error
from worker.errors import RunBusy, RunEnded, RunNotFound
from worker.options.spec import STORED, RunOptions
from worker.store import listing, lua, queued
from worker.store.keys import Keys, RedisClient
from worker.store.status import FINISH_MOVES, RunStatus

CONTRACT_FIELDS = (
    "run_id",
    "harness",
    "status",
    "turns",
    "session_id",
    "resumed",
    "model_requested",
    "model_reported",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "sandbox",
    "container_id",
    "queue",
    "created_at",
    "updated_at",
    "last_error",
)

OutcomeState = Literal["in-progress", "satisfied", "unsatisfied", "max-iterations"]
"""Where a run with ``--outcome`` stands against its rubric (:attr:`RunRecord.outcome`)."""

LONG_FIELDS = frozenset({"options", "warnings", "budget", "slot_wait"})
"""Fields kept out of the run's record, in one JSON object (``Keys.run_long``, a string: each
field's name to its value): JSON that runs past 64 bytes (the options ~500), written at the
start or rarely after. Redis holds a hash whose every value is at most
``hash-max-listpack-value`` (64 by default) as a listpack, and turns it into a hash table for
good at the first longer value: twice the memory of an idle run's record (row 10 of
docs/performance.md); one string costs less than a hash of three long values. None is a field
of the contract, none is read or written by a Lua script: :class:`RunStore` alone writes and
reads them, with the record."""


class RunRecord(BaseModel):
    """One run's record. In Redis every field is a string: an integer or a float as its
    decimal text, a boolean as ``1`` or ``0``, a model, dict or list as JSON, and unknown
    (None) as the empty string. :meth:`decode` and :meth:`encode` are that codec."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: str
    harness: str = ""
    status: RunStatus
    turns: int = 0
    current_turn: int | None = None
    """The turn in flight, or the last one; what ``turns`` was when it began."""
    session_id: str | None = None
    resumed: bool | None = None
    model_requested: str | None = None
    model_reported: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = None
    """None until a harness prices a turn. These four are what the harness reported (source
    ``harness``, with ``replay`` estimates); the model gateway's own count is beside them."""
    gateway_input_tokens: int = 0
    """The run's tokens as the model APIs answered them at the model gateway (source
    ``gateway``; worker/gateway/): input (cached reads included), output, cached, and the
    model requests answered. A difference from the harness's is the harness's to explain."""
    gateway_output_tokens: int = 0
    gateway_cached_input_tokens: int = 0
    gateway_requests: int = 0
    model_served: str | None = None
    """The model the API said served the run's last request through the gateway."""
    sandbox: str | None = None
    container_id: str | None = None
    queue: str | None = None
    """Where the run's later turns go: its sandbox's host queue once it has one."""
    created_at: float | None = None
    updated_at: float | None = None
    last_error: str | None = None
    options: RunOptions | None = None
    carry: dict[str, Any] = Field(default_factory=dict)
    """What the adapter's last turn left for the next (``TurnRequest.carry``)."""
    lease_until: float | None = None
    """Unix time until which the run's sandbox is kept without a turn."""
    warnings: list[str] | None = None
    seed: str | None = None
    """What the workspace was seeded from: ``repo URL@commit`` or ``archive sha256:...``."""
    snapshot: str | None = None
    """The id of the workspace's latest snapshot (after a turn or a rewind)."""
    budget: dict[str, Any] = Field(default_factory=dict)
    """The run's budget (``worker.spend.budgets``): ``max_cost_usd``, ``max_tokens``, ``max_turns``,
    ``max_wall_s`` (null: none), as set at the start and raised by ``harness budget``."""
    budget_exceeded: dict[str, Any] | None = None
    """Which budget stopped or refused the last turn and by how much (``budget``, ``limit``,
    ``used``, ``over_by``); cleared when the budget is raised past it."""
    wall_s: float = 0.0
    """Seconds the run's turns have run, in all."""
    resume_at: float | None = None
    """While ``parked``: unix time at which the worker sends the turn again."""
    parks: int = 0
    """Times the run was parked in a row (reset by a turn that is not limited)."""
    tool_calls: int = 0
    """Calls the run's harness made to its tools (``--tools``, ``--mcp``), in all."""
    network: str | None = None
    """The network mode of the run's sandbox (``none``, ``bridge``, ``host``, ``egress``)."""
    egress_allow: list[str] | None = None
    """With network ``egress``: the ``host:port`` pairs the run may reach (operator policy)."""
    slot_wait: dict[str, Any] | None = None
    """While the current turn waits for a concurrency slot of a key (``worker.spend.slots``):
    ``grant``, ``place`` (1 is next), ``waiting``, ``limit``, ``since``."""
    labels: dict[str, str] = Field(default_factory=dict)
    """The producer's ``KEY=VALUE`` labels (``--label``): runs are listed by them."""
    tenant: str | None = None
    """The API tenant that made the run (``HARNESS_TENANTS_FILE``); None: made without the
    API. Only that tenant sees the run through the API."""
    webhook_url: str | None = None
    """Where the API delivers the run's terminal events and its end (worker/api/webhooks.py)."""
    end_requested_at: float | None = None
    """When a producer asked to end the run (``request_end.lua``): from then on it takes no
    more turns, while its worker tears it down (``status`` says ``ended`` once done)."""
    forked_from: str | None = None
    """The run this one was forked from (``harness fork``), at turn :attr:`forked_at_turn`:
    its workspace started as that turn's snapshot, its conversation as turns 1 to K."""
    forked_at_turn: int | None = None
    group: str | None = None
    """The group of attempts this run is one of (``--attempts N``), number :attr:`attempt`
    (1-based)."""
    attempt: int | None = None
    outcome: OutcomeState | None = None
    """With ``--outcome``: where the run stands against its rubric (``in-progress`` until a
    grader is satisfied, ``satisfied``, ``unsatisfied`` when a budget stops the loop first,
    ``max-iterations``); None without one (worker/outcomes/)."""
    outcome_iterations: int = 0
    """The run's turns its outcome's grader has judged."""

    @classmethod
    def decode(cls, raw: Mapping[str, str]) -> RunRecord:
        """A record from the strings Redis holds (fields we do not know are ignored)."""
        values = {
            name: _CODECS[name][1](text)
            for name, text in raw.items()
            if name in _CODECS and text != ""
        }
        return cls.model_validate(values, context={STORED: True})

    def encode(self) -> dict[str, str]:
        """Every field as the string Redis holds."""
        return encode({name: getattr(self, name) for name in type(self).model_fields})

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON-able typed values (``harness status --json``), null for unknown."""
        return self.model_dump(mode="json")


class RecordChanges(TypedDict, total=False):
    """What a write to a record may change, typed as in :class:`RunRecord` (a test keeps the
    two in step); None makes a field unknown again. Not ``status``: it moves only by the
    transitions of :mod:`worker.store.status`."""

    session_id: str | None
    resumed: bool | None
    model_reported: str | None
    sandbox: str | None
    container_id: str | None
    queue: str | None
    last_error: str | None
    carry: dict[str, Any]
    lease_until: float | None
    warnings: list[str] | None
    seed: str | None
    snapshot: str | None
    budget: dict[str, Any]
    budget_exceeded: dict[str, Any] | None
    wall_s: float
    resume_at: float | None
    parks: int
    tool_calls: int
    network: str | None
    egress_allow: list[str] | None
    slot_wait: dict[str, Any] | None
    gateway_input_tokens: int
    gateway_output_tokens: int
    gateway_cached_input_tokens: int
    gateway_requests: int
    model_served: str | None
    forked_from: str | None
    forked_at_turn: int | None
    group: str | None
    attempt: int | None
    outcome: OutcomeState | None
    outcome_iterations: int


class Lineage(TypedDict, total=False):
    """Where a new run comes from: a fork of another, or one of a group of attempts."""

    forked_from: str
    forked_at_turn: int
    group: str
    attempt: int


def encode(fields: Mapping[str, Any]) -> dict[str, str]:
    """Fields of a record (all or some) as the strings Redis holds."""
    return {name: _CODECS[name][0](value) for name, value in fields.items()}


def _split(encoded: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Encoded fields: those the record holds, and those of :data:`LONG_FIELDS`."""
    record = {name: text for name, text in encoded.items() if name not in LONG_FIELDS}
    return record, {name: text for name, text in encoded.items() if name in LONG_FIELDS}


def _long_text(held: Mapping[str, Any], changes: Mapping[str, str]) -> str:
    """The long fields' JSON object: ``held`` (decoded) with the encoded ``changes`` (an
    unknown value, ``""``, drops its field)."""
    values = dict(held)
    for name, text in changes.items():
        if text == "":
            values.pop(name, None)
        else:
            values[name] = json.loads(text)
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


def _no_long_fields(changes: Mapping[str, Any]) -> dict[str, str]:
    """The changes a script writes into the record, encoded; a script never writes the long
    hash, so a change of one of :data:`LONG_FIELDS` is refused here."""
    long = sorted(LONG_FIELDS.intersection(changes))
    if long:
        raise ValueError(f"{', '.join(long)}: written by RunStore.update, not by a script")
    return encode(changes)


def merge(record: Mapping[str, str], long: str | None) -> dict[str, str]:
    """A record's strings with its long fields, each value as JSON (worker/store/listing.py
    reads them so too): those the record itself holds win (a record written before its long
    fields moved out)."""
    if not record:
        return {}
    values = json.loads(long) if long else {}
    texts = {name: json.dumps(value, ensure_ascii=False) for name, value in values.items()}
    return {**texts, **record}


def _encode_text(value: Any) -> str:
    return "" if value is None else str(value)


def _encode_int(value: Any) -> str:
    return "" if value is None else str(int(value))


def _encode_float(value: Any) -> str:
    return "" if value is None else repr(float(value))


def _encode_bool(value: Any) -> str:
    return "" if value is None else ("1" if value else "0")


def _encode_json(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value)


_Codec = tuple[Callable[[Any], str], Callable[[str], Any]]

_BY_TYPE: dict[object, _Codec] = {
    str: (_encode_text, str),
    int: (_encode_int, lambda text: int(float(text))),
    float: (_encode_float, float),
    bool: (_encode_bool, lambda text: text == "1"),
}
_JSON: _Codec = (_encode_json, json.loads)


def _codec(annotation: Any) -> _Codec:
    """The codec of a declared type: that of ``X`` for ``X | None``, text for a Literal."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return _BY_TYPE[str]
    return _BY_TYPE.get(annotation, _JSON)


_CODECS: dict[str, _Codec] = {
    name: _codec(info.annotation) for name, info in RunRecord.model_fields.items()
}


def _listed(run_id: str, record: Mapping[str, str], long: str | None) -> dict[str, Any] | None:
    raw = merge(record, long)
    if "status" not in raw:
        return None
    return RunRecord.decode({"run_id": run_id, **raw}).as_dict()


@dataclass
class RunStore:
    redis: RedisClient
    keys: Keys
    retention_s: int

    def __post_init__(self) -> None:
        self._scripts = lua.scripts(self.redis)

    def create(
        self,
        run_id: str,
        options: RunOptions,
        queue: str,
        sandbox: str,
        budget: dict[str, Any] | None = None,
        *,
        labels: dict[str, str] | None = None,
        tenant: str | None = None,
        webhook_url: str | None = None,
        warnings: list[str] | None = None,
        lineage: Lineage | None = None,
    ) -> None:
        """A new run's record (``starting``), indexed. ``warnings``: what the producer's
        policy could not enforce; the first turn's worker writes its own over them when they
        differ. ``lineage``: where the run comes from (``forked_from``, ``forked_at_turn``,
        ``group``, ``attempt``)."""
        now = time.time()
        record = RunRecord(
            run_id=run_id,
            harness=options.harness,
            status="starting",
            turns=1,
            current_turn=1,
            model_requested=options.model,
            sandbox=sandbox,
            queue=queue,
            created_at=now,
            updated_at=now,
            options=options,
            budget=budget or {},
            labels=labels or {},
            tenant=tenant,
            webhook_url=webhook_url,
            warnings=warnings or None,
            outcome="in-progress" if options.outcome else None,
            **(lineage or {}),
        )
        fields, long = _split(record.encode())
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.run(run_id), mapping=fields)
        pipe.set(self.keys.run_long(run_id), _long_text({}, long))
        pipe.sadd(self.keys.runs_index(), run_id)
        listing.index_run(
            pipe,
            self.keys,
            run_id,
            created_at=now,
            tenant=tenant,
            harness=options.harness,
            labels=record.labels,
            retention_s=self.retention_s,
        )
        pipe.execute()

    def list_runs(
        self,
        *,
        tenant: str | None = None,
        where: listing.RunFilter | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of ``tenant``'s runs, newest first, and the next page's cursor
        (worker/store/listing.py)."""
        return listing.list_runs(
            self.redis,
            self.keys,
            _listed,
            tenant=tenant,
            where=where or listing.RunFilter(),
            limit=limit,
            cursor=cursor,
        )

    def raw(self, run_id: str) -> dict[str, str]:
        """The record's strings, as Redis holds them (its long fields included)."""
        data = self._read(run_id)
        if not data:
            raise RunNotFound(run_id)
        return data

    def _read(self, run_id: str) -> dict[str, str]:
        pipe = self.redis.pipeline()  # MULTI: the record and its long fields of one moment
        pipe.hgetall(self.keys.run(run_id))
        pipe.get(self.keys.run_long(run_id))
        record, long = pipe.execute()
        return merge(record, long)

    def find(self, run_id: str) -> RunRecord | None:
        """The record, or None when there is none. A hash without a status is none either:
        what a write raced with the record's deletion left of it."""
        data = self._read(run_id)
        if "status" not in data:
            return None
        return RunRecord.decode({"run_id": run_id, **data})

    def record(self, run_id: str) -> RunRecord:
        found = self.find(run_id)
        if found is None:
            raise RunNotFound(run_id)
        return found

    def get(self, run_id: str) -> dict[str, Any]:
        """The record as typed JSON-able values (see :meth:`RunRecord.as_dict`)."""
        return self.record(run_id).as_dict()

    def begin_turn(self, run_id: str) -> int:
        code, detail = self._scripts.begin_turn(self.keys.run(run_id), time.time())
        if code == -1:
            raise RunNotFound(run_id)
        if code == -2:
            raise RunBusy(run_id, int(detail) if detail else None)
        if code == -3:
            raise RunEnded(run_id, detail)
        return code

    def request_end(self, run_id: str) -> str:
        """Mark the run as asked to end: no turn is begun after this returns
        (``request_end.lua``). Its status as the mark found it; RunNotFound when unknown."""
        status = self._scripts.request_end(self.keys.run(run_id), time.time())
        if not status:
            raise RunNotFound(run_id)
        return status

    def mark_running(self, run_id: str, **changes: Unpack[RecordChanges]) -> None:
        """Move a new run from ``starting`` to ``running`` (its first turn has its sandbox),
        with ``changes`` (no long field) in the same script call."""
        now = time.time()
        fields = _no_long_fields({**changes, "updated_at": now}) if changes else {}
        self._scripts.mark_running(self.keys.run(run_id), now, fields)

    def update(self, run_id: str, **changes: Unpack[RecordChanges]) -> None:
        """Change some fields (and ``updated_at``); never ``status``, which moves only by
        :mod:`worker.store.status`'s transitions."""
        if "status" in changes:
            raise ValueError("a run's status moves only by its transitions (worker.store.status)")
        fields, long = _split(encode({**changes, "updated_at": time.time()}))
        if not long:
            self.redis.hset(self.keys.run(run_id), mapping=fields)
            return
        record, long_key = self.keys.run(run_id), self.keys.run_long(run_id)

        def change(pipe: Any) -> None:
            # Read, changed and written back whole under WATCH: redis-py tries again when
            # another write (of another long field) came in between.
            held = pipe.get(long_key)
            pipe.multi()
            pipe.set(long_key, _long_text(json.loads(held) if held else {}, long), keepttl=True)
            pipe.hset(record, mapping=fields)
            pipe.hdel(record, *long)  # from a record written before they moved out

        self.redis.transaction(change, long_key)

    def unbegin_turn(self, run_id: str, turn: int) -> bool:
        """Give back the number of a turn the broker never took (``unbegin_turn.lua``)."""
        return self._scripts.unbegin_turn(
            self.keys.run(run_id),
            self.keys.turn_started(run_id, turn),
            self.keys.turn_queued(run_id, turn),
            turn,
            time.time(),
        )

    def end_run(
        self, run_id: str, *, maxlen: int = 100_000, **changes: Unpack[RecordChanges]
    ) -> str:
        """Move the run to ``ended`` (with ``changes``), and end the turn it has in flight,
        if any, with it (``end_run.lua``): the record never says ended while a turn of the
        run still waits for its terminal. Returns the status it left, or '' when it had
        already ended or is gone."""
        fields = _no_long_fields(changes)
        error = session_error("the run was ended before this turn finished", "cancelled")
        key = self.keys.run(run_id)
        while True:
            turn_text, harness = self.redis.hmget(key, ["current_turn", "harness"])
            turn = int(turn_text or 0)
            header = TurnStarted(harness=harness or "", attempt=1, input_chars=0).data_json()
            now = time.time()
            left = self._scripts.end_run(
                (key, self.keys.events(run_id), self.keys.turn_started(run_id, turn)),
                now,
                turn,
                maxlen=maxlen,
                mark_ttl_s=self.retention_s,
                header=header,
                terminal=(error.type, error.data_json()),
                fields=fields,
            )
            if left is not None:
                return left

    def end_turn(
        self,
        run_id: str,
        turn: int,
        *,
        caller: str,
        status: RunStatus,
        header: str,
        terminal: tuple[str, str],
        usage: tuple[int, int, int, float | None],
        changes: RecordChanges,
        maxlen: int,
        mark_ttl_s: int,
    ) -> tuple[bool, str]:
        """The turn's terminal event and its record, written together once (``end_turn.lua``):
        (True, the terminal's entry id), or (False, why not: ``ended``, ``owned``,
        ``not-owner``)."""
        input_tokens, output_tokens, cached, cost = usage
        fields = _no_long_fields(changes)
        return self._scripts.end_turn(
            (
                self.keys.run(run_id),
                self.keys.events(run_id),
                self.keys.turn_started(run_id, turn),
                self.keys.turn_owner(run_id, turn),
            ),
            turn,
            caller,
            FINISH_MOVES[status],
            now=time.time(),
            maxlen=maxlen,
            mark_ttl_s=mark_ttl_s,
            header=header,
            terminal=terminal,
            tokens=(input_tokens, output_tokens, cached),
            cost=cost,
            fields=fields,
        )

    def queued_since(self, run_id: str, turn: int) -> float | None:
        """When a turn no worker has taken yet was first sent (its queued entry, which the
        reaper rewrites when it sends the turn again), or None when there is no such entry."""
        entry = queued.read(self.redis, self.keys, run_id, turn)
        return None if entry is None else entry.first_sent_at

    def expire(self, run_id: str, seconds: int, record: RunRecord | None = None) -> None:
        """Give the run's keys ``seconds`` to live, and its listing indexes at least as long
        (those of ``record``, when the caller has read it, else of the record read now)."""
        found = record if record is not None else self.find(run_id)
        pipe = self.redis.pipeline()
        for key in self.keys.run_keys(run_id):
            pipe.expire(key, seconds)
        if found is not None:
            listing.keep_indexed(
                pipe,
                self.keys,
                tenant=found.tenant,
                harness=found.harness,
                labels=found.labels,
                seconds=seconds,
            )
        pipe.execute()

    def append_transcript(self, run_id: str, turn: int, text_in: str, text_out: str) -> None:
        entry = json.dumps({"turn": turn, "input": text_in, "output": text_out})
        self.redis.rpush(self.keys.transcript(run_id), entry)

    def transcript(self, run_id: str) -> list[dict[str, Any]]:
        raw = self.redis.lrange(self.keys.transcript(run_id), 0, -1)
        return [json.loads(item) for item in raw]
