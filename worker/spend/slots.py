"""Concurrency per API key: at most N turns at once per granted credential, fleet-wide.

``HARNESS_KEY_SLOTS`` names the limited grants (``OPENAI_API_KEY=4``). A turn whose run is
granted one takes a *slot* of that credential before the worker claims it. The credential is
known by a hash of its value (never the value: two grant names holding one key share its
slots, two workers holding different values do not). Its slots live in Redis:

- ``holders``: a sorted set of holders scored by when the hold lapses (a backstop: the
  reaper releases a slot as soon as the heartbeat of the turn holding it is gone, or the
  turn's claim went to another copy). A holder is named by the attempt that took the slot,
  ``run_id/turn/CLAIM-TOKEN/NONCE`` (:func:`holder`): two copies of one turn (a broker's
  redelivery) each hold under their own name, so the copy that loses the claim releases its
  own slot, never the winner's;
- ``waiting``: a sorted set of the turns waiting (``run_id/turn``: a turn keeps its place
  whichever copy asks), scored by when they first asked; ``who`` (a hash: member or holder
  to producer) and ``seen`` (member to the last time it asked);
- ``caps``: a hash of producer to the most slots it may hold at once, from the run's
  ``key_slots`` (a tenant's policy: ``worker.api.tenants``), always within the limit.

Taking a slot is one Lua call (:data:`worker.store.lua.SLOT_TAKE`): the waiting turns are put in a
fair order (a producer's k-th waiting turn, counting the slots it already holds, comes after
every other producer's (k-1)-th; in order of asking within a rank, so nobody starves), and the
first ``N - held`` of that order get a slot. A producer's turn beyond its cap (its k-th,
counting the slots it holds, with k at or past the cap) comes after all the others and takes
none: a tenant at its cap leaves the free slots to the other tenants.

A turn that gets none is **not** held by its worker: it is sent back to its queue with a
countdown of ``HARNESS_SLOT_RETRY_S`` and asks again then. A worker process slot waiting on
a key would be a slot another run's turn (on another key, or a turn already holding a slot)
cannot use, and a fleet whose processes all wait would deadlock against turns queued behind
them; a countdown in the broker costs nothing while it waits and survives the worker's
restart. Meanwhile the run record's ``slot_wait`` says which grant, the turn's place and how
many wait (``harness status``, and ``--follow`` says it once).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from adapters.events import TERMINAL_TYPES
from worker.deps import TurnDeps
from worker.observe import metrics
from worker.options.spec import RunOptions, TurnPayload
from worker.store import lua, queued
from worker.store.publisher import last_seq
from worker.store.status import EXECUTING

log = logging.getLogger(__name__)

HOLD_BACKSTOP_S = 300.0
"""A hold lapses this long after the longest turn could end, should everything else fail."""
UNCLAIMED_GRACE_S = 60.0
"""A slot taken by a turn no worker has claimed this long after (its worker died between
taking the slot and claiming the turn) is released by the reaper."""


def credential_hash(value: str) -> str:
    """What names a credential in Redis: a hash of its value, never the value."""
    return hashlib.sha256(b"harness-key-slot\0" + value.encode("utf-8")).hexdigest()[:32]


def member(run_id: str, turn: int) -> str:
    """A turn as it waits for a slot."""
    return f"{run_id}/{turn}"


def holder(run_id: str, turn: int, token: str) -> str:
    """One attempt at a turn as it holds a slot: the claim token it will claim the turn with
    (the started mark holds the winner's), and a nonce (two copies of one delivery in one
    process share a token)."""
    return f"{member(run_id, turn)}/{token}/{uuid.uuid4().hex[:12]}"


def _holding_token(name: str) -> tuple[str, int, str | None]:
    """The run, turn and claim token a holder names (no token: a hold named by its turn)."""
    run_id, _, rest = name.partition("/")
    turn_text, _, tail = rest.partition("/")
    token = tail.rpartition("/")[0] if tail else None
    return run_id, int(turn_text or 0), token


@dataclass
class Hold:
    """The slots a turn holds (none for a run on no limited grant)."""

    deps: TurnDeps | None = None
    held: list[str] = field(default_factory=list)
    who: str = ""
    """The holder's name (:func:`holder`)."""

    def release(self) -> None:
        if self.deps is None or not self.held:
            return
        scripts = lua.scripts(self.deps.redis)
        for digest in self.held:
            scripts.slot_release(*_keys(self.deps, digest), self.who)
        self.held = []


NO_HOLD = Hold()


def _keys(deps: TurnDeps, digest: str) -> tuple[str, str, str, str]:
    keys = deps.keys
    return (
        keys.slots(digest, "holders"),
        keys.slots(digest, "waiting"),
        keys.slots(digest, "who"),
        keys.slots(digest, "seen"),
    )


def limited(options: RunOptions, limits: dict[str, str]) -> list[tuple[str, int, str]]:
    """(grant, limit, credential hash) of each limited grant the run has a value for, in a
    fixed order (two turns taking two keys take them in the same order)."""
    out = []
    for grant in sorted(set(options.grants)):
        if grant not in limits:
            continue
        value = os.environ.get(grant)
        if value is None:
            continue  # the turn is refused later (grant not available on this worker)
        out.append((grant, int(limits[grant]), credential_hash(value)))
    return sorted(out, key=lambda item: item[2])


@dataclass(frozen=True)
class SlotWaiting:
    """A notice: the turn waits for a concurrency slot of a key (``place`` 1 is next)."""

    run_id: str
    turn: int
    grant: str
    place: int
    waiting: int
    limit: int
    since: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "notice": "waiting",
            "for": "slot",
            "run_id": self.run_id,
            "turn": self.turn,
            "grant": self.grant,
            "place": self.place,
            "waiting": self.waiting,
            "limit": self.limit,
            "since": self.since,
        }


def _ended(deps: TurnDeps, run_id: str, turn: int) -> bool:
    """A turn its owner ended (its started mark is gone with it): a copy of its message is a
    duplicate, which takes no slot and waits for none."""
    return last_seq(deps.redis, deps.keys, run_id, turn)[1] in TERMINAL_TYPES


def take(
    deps: TurnDeps,
    payload: TurnPayload,
    options: RunOptions,
    requeue: Callable[[dict[str, Any], str, float], None] | None = None,
    *,
    token: str = "",
) -> Hold | None:
    """Take a slot of every limited key of the run, held under the name of this attempt
    (``token``: the token it claims the turn with); None when the turn must wait, in which
    case it has been sent back to its queue (``requeue``) to ask again later."""
    limits = deps.settings.key_slots
    if not limits or not options.grants:
        return NO_HOLD
    wanted = limited(options, limits)
    if not wanted:
        return NO_HOLD
    run_id, turn = payload.run_id, payload.turn
    waiter = member(run_id, turn)
    if deps.redis.exists(deps.keys.turn_started(run_id, turn)) or _ended(deps, run_id, turn):
        # Taken, cancelled, closed or ended already: the claim decides, and the turn waits no
        # more (a turn cancelled while it waited holds up nobody's place). Only its place in
        # line is given up: a hold is its attempt's own to release.
        scripts = lua.scripts(deps.redis)
        for _, _, digest in wanted:
            scripts.slot_release(*_keys(deps, digest), waiter)
        return NO_HOLD
    producer = options.producer or ""
    caps = (options.key_slots or {}) if producer else {}
    now = time.time()
    hold = Hold(deps, [], holder(run_id, turn, token or uuid.uuid4().hex))
    scripts = lua.scripts(deps.redis)
    backstop = deps.settings.max_turn_timeout_s + HOLD_BACKSTOP_S
    forget_after = max(30.0, 10 * deps.settings.slot_retry_s)
    for grant, limit, digest in wanted:
        got, place, waiting = scripts.slot_take(
            *_keys(deps, digest),
            waiter,
            producer,
            limit,
            now,
            backstop,
            forget_after,
            caps=deps.keys.slots(digest, "caps"),
            cap=min(caps.get(grant, 0), limit),
            holder=hold.who,
        )
        deps.redis.sadd(deps.keys.slots_index(), digest)
        if got:
            hold.held.append(digest)
            continue
        hold.release()  # all or none: holding one key while waiting for another blocks both
        if place == 0:
            # Another copy of this turn holds its slot (a broker's redelivery): that copy claims
            # the turn. This one asks again later, to find it claimed, or the slot free should
            # that copy have died before its claim (the reaper releases its hold).
            log.info("turn.copy_holds_slot", extra={"run_id": run_id, "turn": turn})
            entry = queued.read(deps.redis, deps.keys, run_id, turn)
            if entry is not None:  # else claimed already: this copy is done
                send = requeue or deps.send_turn
                send(payload.model_dump(), entry.queue, deps.settings.slot_retry_s)
            return None
        _wait(deps, payload, grant, place, waiting, limit, now, requeue)
        return None
    if hold.held:
        _clear_wait(deps, run_id)
    return hold


def _wait(
    deps: TurnDeps,
    payload: TurnPayload,
    grant: str,
    place: int,
    waiting: int,
    limit: int,
    now: float,
    requeue: Callable[[dict[str, Any], str, float], None] | None,
) -> None:
    run_id, turn = payload.run_id, payload.turn
    record = deps.store.find(run_id)
    if record is None:
        return
    previous = record.slot_wait or {}
    since = previous.get("since") if previous.get("turn") == turn else None
    if since is None:
        metrics.slot_wait_began()
    wait = {
        "turn": turn,
        "grant": grant,
        "place": place,
        "waiting": waiting,
        "limit": limit,
        "since": since or now,
    }
    deps.store.update(run_id, slot_wait=wait)
    entry = queued.read(deps.redis, deps.keys, run_id, turn)
    queue = (entry.queue if entry else "") or record.queue or ""
    if entry is not None:
        # The reaper sends a turn nobody took again after HARNESS_RESEND_AFTER_S: this one is
        # in the broker, counting down. Say when it was last sent, so it is not sent twice.
        entry.sent_again(now + deps.settings.slot_retry_s).write(
            deps.redis, deps.keys, run_id, turn, deps.settings.retention_s
        )
    log.info(
        "turn.waiting_for_slot",
        extra={"run_id": run_id, "turn": turn, "grant": grant, "place": place},
    )
    send = requeue or deps.send_turn
    send(payload.model_dump(), queue, deps.settings.slot_retry_s)


def _clear_wait(deps: TurnDeps, run_id: str) -> None:
    record = deps.store.find(run_id)
    if record is not None and record.slot_wait is not None:
        metrics.slot_taken_after(time.time() - float(record.slot_wait.get("since") or time.time()))
        deps.store.update(run_id, slot_wait=None)


def waiting_notice(run_id: str, record: dict[str, Any]) -> SlotWaiting | None:
    """The notice for a run record (typed, as the client reads it) whose current turn waits."""
    wait = record.get("slot_wait")
    turn = record.get("current_turn")
    if not wait or wait.get("turn") != turn or record.get("status") not in EXECUTING:
        return None
    return SlotWaiting(
        run_id,
        int(turn),
        str(wait.get("grant")),
        int(wait.get("place") or 0),
        int(wait.get("waiting") or 0),
        int(wait.get("limit") or 0),
        wait.get("since"),
    )


def reap(deps: TurnDeps) -> list[str]:
    """Release slots whose turn's worker is gone: the turn was claimed and its owner
    heartbeat lapsed (a lost worker), the turn was claimed by another copy than the one
    holding the slot (a loser that died before it let go), or no worker claimed it within
    UNCLAIMED_GRACE_S (its worker died between taking the slot and claiming the turn); also
    lapsed holds."""
    released: list[str] = []
    keys, now = deps.keys, time.time()
    backstop = deps.settings.max_turn_timeout_s + HOLD_BACKSTOP_S
    scripts = lua.scripts(deps.redis)
    for digest in deps.redis.smembers(keys.slots_index()):
        holders, *_ = _keys(deps, digest)
        entries = scripts.slot_holders(holders)
        if not entries:
            continue
        for who, lapses in entries:
            run_id, turn, token = _holding_token(who)
            taken_at = lapses - backstop
            mark = deps.redis.get(keys.turn_started(run_id, turn))
            claimed = mark is not None
            alive = deps.redis.exists(keys.turn_owner(run_id, turn))
            lost = (claimed and not alive) or (not claimed and now - taken_at > UNCLAIMED_GRACE_S)
            lost = lost or (claimed and token is not None and mark != token)
            if lost or lapses < now:
                scripts.slot_release(*_keys(deps, digest), who)
                released.append(f"{digest[:8]}:{who}")
                log.warning("slot.released_lost", extra={"slot": digest[:8], "turn": who})
    return released
