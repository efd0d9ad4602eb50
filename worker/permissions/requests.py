"""Permission requests answered live (``--posture ask``): durable in Redis, first answer wins.

A harness that asks (its adapter appends an :class:`adapters.asks.Ask` to ``state.asks``)
waits; the turn's :class:`Gate` gives the request an id (``p{turn}-{n}``) and a deadline,
keeps it in the run's ``permissions`` hash and publishes a ``permission-request`` event.
Anyone who can reach Redis answers it (:func:`answer`: ``harness approve``/``deny``,
``HarnessClient.approve``/``deny``): the answer is written once into the run's
``permission-answers`` hash by a Lua script, so the first answer wins and a second, a late
or an unknown one is refused with a reason. The read loop polls the answers of its waiting
requests as it polls for a cancel, hands each to the adapter (which writes the harness's
reply to its stdin) and publishes a ``permission-decision`` event.

One owner writes and reads a turn's requests and their answers: :class:`Asker`, for the
harness's own asks (the :class:`Gate` of its read loop) and for the MCP tool calls the run's
endpoint asks about (``worker.tools.asking``) alike: the same record, the same rules first
(the run's ``--allow``/``--deny`` patterns, then an earlier ``--always``), the same worker
denials, the same ``permission-decision``.

Fail closed: no answer by the deadline is a deny (written through the same script, so it
races fairly with a person's answer); a cancel, a timeout, a worker shutdown or a harness
that ends the turn denies what is pending, and tells the harness so before it is stopped; a
lost worker's pending requests are denied by whoever closes its turn; an answer that cannot
be written to the harness is recorded as a deny. While a request waits the turn and idle
timeouts stand still (:mod:`worker.turn.attempt`); ``HARNESS_PERMISSION_TIMEOUT_S`` bounds it.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import json
import logging
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from adapters.asks import DENIED_MESSAGE, Ask, Decision
from adapters.events import (
    PERMISSION_INPUT_LIMIT,
    Event,
    PermissionDecision,
    PermissionRequest,
    SessionError,
)
from adapters.protocol import Adapter, AdapterState
from sandbox.base import Process
from worker.errors import AnswerRefused, InvalidInput, RequestNotFound
from worker.observe import metrics, tracing
from worker.observe.masking import Masker
from worker.options.spec import RunOptions
from worker.permissions import rules as permission_rules
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis
from worker.store.lua import scripts

if TYPE_CHECKING:
    from worker.deps import TurnDeps

log = logging.getLogger(__name__)

REQUEST_ID = re.compile(r"^p[0-9]{1,9}-[0-9]{1,9}$")
BY = re.compile(r"^[^\x00-\x1f]{1,200}$")
MESSAGE_LIMIT = 4000
_SECRET_NAMES = re.compile(r"(?i)(token|secret|passw(or)?d|api[_-]?key|authorization|cookie)")
_SECRET_VALUE = "***"


def who() -> str:
    """The default identity of an answer: ``user@host`` of the process giving it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:200]


def gate_for(
    deps: TurnDeps, run_id: str, turn: int, options: RunOptions, masker: Masker
) -> Gate | None:
    """The turn's gate when the run asks (``--posture ask``), else None."""
    if options.posture != "ask":
        return None
    return Gate(
        deps.redis,
        deps.keys,
        run_id,
        turn,
        timeout_s=deps.settings.permission_timeout_s,
        masker=masker,
        allow=options.allow,
        deny=options.deny,
    )


def _answer(
    client: SyncRedis, keys: Keys, run_id: str, request_id: str, answer: str, *, closing: bool
) -> tuple[str, str]:
    """``answer_permission.lua``: first answer wins; a worker closing a request ignores its
    deadline."""
    return scripts(client).answer_permission(
        keys.permissions(run_id), keys.permission_answers(run_id), request_id, answer,
        time.time(), closing,
    )  # fmt: skip


def _answer_json(allow: bool, always: bool, by: str, message: str | None, at: float) -> str:
    return json.dumps(
        {
            "decision": "allow" if allow else "deny",
            "scope": "always" if always and allow else "once",
            "by": by,
            "message": message,
            "at": at,
        }
    )


def _said(answer: dict[str, Any]) -> str:
    return f"{answer.get('decision')} by {answer.get('by')}"


def answer(
    client: SyncRedis,
    keys: Keys,
    run_id: str,
    request_id: str,
    *,
    allow: bool,
    by: str,
    always: bool = False,
    message: str | None = None,
) -> dict[str, Any]:
    """Record a producer's answer to a waiting request; returns it. Raises
    :class:`RequestNotFound` (no such request in the run) or :class:`AnswerRefused`
    (answered already, expired, or its turn ended)."""
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        raise RequestNotFound(f"unknown permission request {request_id!r} in run {run_id}")
    if not BY.fullmatch(by):
        raise InvalidInput("the answerer's identity must be 1 to 200 printable characters")
    if message is not None and len(message) > MESSAGE_LIMIT:
        raise InvalidInput(f"the message is over {MESSAGE_LIMIT} characters")
    now = time.time()
    text = _answer_json(allow, always, by, message, now)
    status, detail = _answer(client, keys, run_id, request_id, text, closing=False)
    if status == "unknown":
        raise RequestNotFound(f"unknown permission request {request_id!r} in run {run_id}")
    if status == "answered":
        prior = json.loads(detail)
        raise AnswerRefused(
            f"permission request {request_id} was already answered ({_said(prior)}); "
            "the first answer wins"
        )
    if status == "expired":
        deadline = json.loads(detail).get("deadline")
        raise AnswerRefused(
            f"permission request {request_id} expired at "
            f"{time.strftime('%H:%M:%S', time.localtime(deadline))}: it is denied"
        )
    recorded: dict[str, Any] = json.loads(text)
    return recorded


def pending(client: SyncRedis, keys: Keys, run_id: str) -> list[dict[str, Any]]:
    """The run's requests still waiting for an answer, oldest first."""
    requests = client.hgetall(keys.permissions(run_id))
    answered = set(client.hkeys(keys.permission_answers(run_id)))
    waiting = [json.loads(v) for k, v in requests.items() if k not in answered]
    return sorted(waiting, key=lambda r: (r.get("turn", 0), r.get("n", 0)))


def close_turn(client: SyncRedis, keys: Keys, run_id: str, turn: int, by: str) -> int:
    """Deny what a turn left pending (its worker was lost); returns how many."""
    closed = 0
    for request in pending(client, keys, run_id):
        if request.get("turn") != turn:
            continue
        answer = _answer_json(False, False, by, None, time.time())
        status, _ = _answer(client, keys, run_id, request["request_id"], answer, closing=True)
        closed += status == "ok"
    return closed


def fingerprint(tool: str, value: Any) -> str:
    """Names one tool call for ``--always``: the same tool with the same input."""
    text = json.dumps([tool, value], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def shown_input(value: Any, masker: Masker) -> tuple[str, int]:
    """The tool input as producers see it: JSON text, secret-looking fields and granted
    values masked, cut at :data:`PERMISSION_INPUT_LIMIT`; and its full length."""
    text = value if isinstance(value, str) else json.dumps(_mask_fields(value), default=str)
    text = masker.mask(text)
    return text[:PERMISSION_INPUT_LIMIT], len(text)


def _mask_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _SECRET_VALUE
            if isinstance(k, str) and _SECRET_NAMES.search(k) and isinstance(v, str)
            else _mask_fields(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mask_fields(v) for v in value]
    return value


@dataclass(frozen=True)
class Answer:
    """How a request was answered: by a person (``harness approve``/``deny``), a rule, or
    the worker (a deny)."""

    allow: bool
    always: bool
    by: str
    message: str | None = None

    @classmethod
    def stored(cls, text: str) -> Answer:
        """The answer as the run's ``permission-answers`` hash keeps it (JSON)."""
        data = json.loads(text)
        allow = data.get("decision") == "allow"
        return cls(
            allow=allow,
            always=allow and data.get("scope") == "always",
            by=str(data.get("by") or "unknown"),
            message=data.get("message") or None,
        )

    def json(self, at: float) -> str:
        return _answer_json(self.allow, self.always, self.by, self.message, at)


@dataclass(frozen=True)
class Asked:
    """One request, opened by :meth:`Asker.open`."""

    request_id: str
    ask: Ask
    event: PermissionRequest
    fingerprint: str
    asked_at: float
    deadline: float
    ruled: Answer | None
    """Settled at once (a run's pattern, an earlier ``--always``); None: it waits for an
    answer in Redis."""


class Asker:
    """The one writer and reader of a turn's permission requests and their answers in Redis.

    :meth:`open` makes a request (rules first, then ``--always``, else recorded to wait),
    :meth:`answers` reads what was answered, :meth:`deny` is the worker's answer (first answer
    wins), :meth:`settle` the decision: ``--always`` remembered, the ``permission-decision``
    event, the log, the wait's metrics and span.
    """

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        run_id: str,
        turn: int,
        *,
        timeout_s: float,
        masker: Masker,
        clock: Callable[[], float] = time.time,
        allow: tuple[str, ...] = (),
        deny: tuple[str, ...] = (),
    ) -> None:
        self.client, self.keys, self.run_id, self.turn = client, keys, run_id, turn
        self.timeout_s, self.masker, self.clock = timeout_s, masker, clock
        self.patterns = (allow, deny)
        """The run's ``--allow`` and ``--deny`` patterns (:mod:`worker.permissions.rules`):
        they answer a request before anyone is asked."""

    def open(self, request_id: str, ask: Ask) -> Asked:
        """A request for ``ask``: its ``permission-request`` event, settled at once by the
        run's patterns or an earlier ``--always``, else recorded to wait for an answer."""
        text, size = shown_input(ask.input, self.masker)
        description = self.masker.mask(ask.description or ask.tool)
        command = self.masker.mask(ask.command) if ask.command else None
        asked_at = self.clock()
        deadline = asked_at + self.timeout_s
        event = PermissionRequest(
            request_id=request_id,
            description=description,
            command=command,
            tool=ask.tool,
            input=text,
            input_chars=size,
            deadline=deadline,
        )
        print_ = fingerprint(ask.tool, ask.input)
        asked = functools.partial(Asked, request_id, ask, event, print_, asked_at, deadline)
        ruled = permission_rules.decide(*self.patterns, ask)
        if ruled is not None:
            allowed, by = ruled
            message = None if allowed else f"Denied by the run's rule {by.split(':', 2)[2]}."
            log.info(
                "permission.ruled",
                extra={"run_id": self.run_id, "request_id": request_id, "by": by},
            )
            return asked(Answer(allowed, False, by, message))
        try:
            always = self.client.sismember(self.keys.permission_always(self.run_id), print_)
        except REDIS_ERRORS:
            always = False
        if always:
            return asked(Answer(True, True, "rule:always"))
        record = {
            "request_id": request_id,
            "run_id": self.run_id,
            "turn": self.turn,
            "n": int(request_id.rsplit("-", 1)[1]),
            "tool": ask.tool,
            "description": description,
            "command": command,
            "input": text,
            "input_chars": size,
            "deadline": deadline,
            "asked_at": asked_at,
        }
        self.client.hset(self.keys.permissions(self.run_id), request_id, json.dumps(record))
        log.info(
            "permission.requested",
            extra={"run_id": self.run_id, "request_id": request_id, "tool": ask.tool},
        )
        return asked(None)

    def answers(self, request_ids: list[str]) -> dict[str, Answer]:
        """The answers given so far to these requests (none while Redis is away)."""
        if not request_ids:
            return {}
        try:
            raw = self.client.hmget(self.keys.permission_answers(self.run_id), request_ids)
        except REDIS_ERRORS:
            return {}
        return {rid: Answer.stored(t) for rid, t in zip(request_ids, raw, strict=True) if t}

    def deny(self, request_id: str, by: str, *, abort: bool) -> Answer:
        """The worker answers a waiting request: a deny, unless a person's answer got in first
        and the turn goes on (``abort`` false). Redis away: denied here all the same."""
        denial = Answer(False, False, by, self._told(by))
        try:
            status, detail = _answer(
                self.client, self.keys, self.run_id, request_id, denial.json(self.clock()),
                closing=True,
            )  # fmt: skip
        except REDIS_ERRORS:
            return denial
        if status == "answered" and not abort:
            return Answer.stored(detail)
        return denial

    def record(self, request_id: str, answer: Answer) -> None:
        """Write over a request's answer (one that could not be carried out stands as
        given, in its ``permission-decision``); best effort."""
        with contextlib.suppress(*REDIS_ERRORS):
            self.client.hset(
                self.keys.permission_answers(self.run_id), request_id, answer.json(self.clock())
            )

    def settle(self, asked: Asked, answer: Answer) -> PermissionDecision:
        """The request's decision: ``--always`` remembered, logged, and, when it waited, its
        wait measured."""
        if answer.always and answer.by != "rule:always":
            try:
                self.client.sadd(self.keys.permission_always(self.run_id), asked.fingerprint)
            except REDIS_ERRORS:
                log.warning("permission.always_unrecorded", extra={"run_id": self.run_id})
        decision: Literal["allow", "deny"] = "allow" if answer.allow else "deny"
        log.info(
            "permission.decided",
            extra={
                "run_id": self.run_id,
                "request_id": asked.request_id,
                "decision": decision,
                "by": answer.by,
            },
        )
        if asked.ruled is None:
            now = self.clock()
            metrics.permission_decided(decision, answer.by, now - asked.asked_at)
            tracing.past_span(
                "permission wait",
                asked.asked_at,
                now,
                {"harness.permission.tool": asked.ask.tool, "harness.permission.by": answer.by},
            )
        return PermissionDecision(
            request_id=asked.request_id,
            decision=decision,
            scope="always" if answer.always else "once",
            by=answer.by,
            message=answer.message,
        )

    def _told(self, by: str) -> str | None:
        if by == "worker:deadline":
            return f"No answer within {self.timeout_s:g}s: the tool call was denied."
        return None


_STOP_BY = {
    "cancelled": "worker:cancelled",
    "shutdown": "worker:shutdown",
    "timeout": "worker:timeout",
    "budget": "worker:budget",
}


class Gate:
    """One turn's permission requests, between its adapter, its process and Redis (through
    the turn's :class:`Asker`).

    :meth:`attach` binds it to an attempt (its adapter state and process); the read loop
    calls :meth:`collect` after every feed, :meth:`poll` with its cancel check, :meth:`close`
    before the process is stopped, and :meth:`turn_over` once the turn has its terminal
    event. Redis errors while polling are ridden out (the deadline still holds locally).
    """

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        run_id: str,
        turn: int,
        *,
        timeout_s: float,
        masker: Masker,
        clock: Callable[[], float] = time.time,
        allow: tuple[str, ...] = (),
        deny: tuple[str, ...] = (),
    ) -> None:
        self.asker = Asker(
            client, keys, run_id, turn, timeout_s=timeout_s, masker=masker, clock=clock,
            allow=allow, deny=deny,
        )  # fmt: skip
        self.turn = turn
        self.clock = clock
        self._count = 0
        self._waiting: dict[str, Asked] = {}
        self._adapter: Adapter[AdapterState] | None = None
        self._state: AdapterState | None = None
        self._process: Process | None = None

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def attach(self, adapter: Adapter[AdapterState], state: AdapterState, process: Process) -> None:
        self._adapter, self._state, self._process = adapter, state, process
        self._waiting.clear()

    def collect(self) -> list[Event]:
        """Take the asks the last feed found: publish each, allow at once what ``--always``
        allowed earlier in the run. Also writes what the adapter queued for stdin."""
        state = self._state
        if state is None:
            return []
        events: list[Event] = []
        while state.asks:
            events.extend(self._take(state.asks.pop(0)))
        self._flush()
        return events

    def poll(self) -> list[Event]:
        """Apply the answers that came in and deny what passed its deadline."""
        if not self._waiting:
            return []
        answers = self.asker.answers(list(self._waiting))
        events: list[Event] = []
        now = self.clock()
        for request_id, asked in list(self._waiting.items()):
            answer = answers.get(request_id)
            if answer is not None:
                events.extend(self._apply(request_id, answer))
            elif now >= asked.deadline:
                answer = self.asker.deny(request_id, "worker:deadline", abort=False)
                events.extend(self._apply(request_id, answer))
        return events

    def close(self, stop: SessionError | None) -> list[Event]:
        """The turn is ending with requests pending: deny them all, telling the harness to
        stop (before it is stopped: a harness that keeps a request across an abort must not
        find it open)."""
        if not self._waiting:
            return []
        by = _STOP_BY.get(stop.reason, f"worker:{stop.reason}") if stop else "worker:turn-ended"
        events: list[Event] = []
        for request_id in list(self._waiting):
            answer = self.asker.deny(request_id, by, abort=True)
            events.extend(self._apply(request_id, answer, abort=True))
        return events

    def turn_over(self) -> None:
        """The turn has its terminal event: end the harness's stdin (some wait for EOF)."""
        if self._process is not None:
            self._process.close_stdin()

    # -- inside ------------------------------------------------------------------------------

    def _take(self, ask: Ask) -> list[Event]:
        self._count += 1
        asked = self.asker.open(f"p{self.turn}-{self._count}", ask)
        if asked.ruled is None:
            self._waiting[asked.request_id] = asked
            return [asked.event]
        answer = asked.ruled
        delivered = self._answer(ask, Decision(answer.allow, answer.always, answer.message))
        if not delivered and answer.allow:
            answer = Answer(False, False, "worker:channel")
        return [asked.event, self.asker.settle(asked, answer)]

    def _apply(self, request_id: str, answer: Answer, *, abort: bool = False) -> list[Event]:
        asked = self._waiting.pop(request_id, None)
        if asked is None:
            return []
        decision = Decision(answer.allow, answer.always, answer.message, abort)
        if not self._answer(asked.ask, decision) and answer.allow:
            # The harness no longer reads its stdin: the allow never reaches it.
            answer = Answer(
                False, False, "worker:channel", "the answer could not be delivered to the harness"
            )
            self.asker.record(request_id, answer)
        return [self.asker.settle(asked, answer)]

    def _answer(self, ask: Ask, decision: Decision) -> bool:
        """Hand the decision to the adapter and write its reply; False if it cannot be."""
        assert self._state is not None and self._adapter is not None
        if decision.message is None and not decision.allow:
            decision = Decision(False, False, DENIED_MESSAGE, decision.abort)
        self._adapter.answer(self._state, ask, decision)
        return self._flush()

    def _flush(self) -> bool:
        state, process = self._state, self._process
        assert state is not None and process is not None
        ok = True
        while state.outbox:
            ok = process.write(state.outbox.pop(0)) and ok
        return ok
