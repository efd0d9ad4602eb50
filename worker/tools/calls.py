"""Tool calls as durable requests in Redis, answered by producer code (``--tools NAME``).

The run's endpoint adds each call to the set's stream (:meth:`Keys.tool_calls`: run id,
call id, tool, arguments, deadline) and waits on the call's reply list. A set is its
tenant's: a run of tenant T that names ``orders`` reaches T's ``orders``, served with
``tenant=T``, never another tenant's nor the one served without a tenant, unless the operator
shares that name with every tenant (``HARNESS_SHARED_TOOL_SETS``;
:func:`worker.options.tenant_names.owned` names the stream). Every server of the
set (:class:`ToolServer`: ``HarnessClient.serve_tools``, ``harness tools serve``) reads the
stream in one consumer group, so each call goes to one of them. A server runs up to
``concurrency`` handlers at once (a thread pool) and takes a call only when it has a free
slot, so it never holds a call it cannot start. It holds each claim while the handler runs
(one thread renews them all every third of the lease), and a server that dies mid-call leaves
its calls pending: another server takes each once its claim has been idle for the lease
(``XAUTOCLAIM``). A server that takes a call says so on the call's reply list at once
(``taken_by``, ``at``), so a call that was taken but not answered by its deadline is
reported as slow, not as one no server took. A call past its deadline is dropped unanswered
(the endpoint already told the harness so). Answers: the handler's result as text, or the
text of what it raised (never a traceback), or a refusal (unknown tool, arguments that do not
fit).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from worker.options.tenant_names import owned
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, StreamEntry, SyncRedis
from worker.tools.backend import BackendError, Reply
from worker.tools.schema import Tool, ToolError, definitions_json

log = logging.getLogger(__name__)

GROUP = "servers"
REPLY_TTL_S = 300
"""How long an answer waits for the endpoint that asked (it reads it at once when alive)."""
STREAM_MAXLEN = 10_000
"""About this many calls kept per set: answered ones are deleted, so only a set with no
server for a long time gets near it (its oldest calls are past their deadline anyway)."""
DEFAULT_LEASE_S = 30.0
DEFAULT_CONCURRENCY = 8
"""Calls one server answers at once (its handlers' threads)."""
MAX_CONCURRENCY = 256
ERROR_LIMIT = 2000
"""The most of a handler's error text a harness gets."""


def ensure_group(client: SyncRedis, keys: Keys, tool_set: str) -> None:
    """The set's stream and consumer group, from the stream's first entry (calls made before
    any server started are served too)."""
    try:
        client.xgroup_create(keys.tool_calls(tool_set), GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def publish_definitions(
    client: SyncRedis, keys: Keys, tool_set: str, tools: Mapping[str, Tool]
) -> None:
    client.set(keys.tool_definitions(tool_set), definitions_json(tools))


def definitions(client: SyncRedis, keys: Keys, tool_set: str) -> list[dict[str, Any]]:
    """The set's tools as its servers last published them; empty before any server ran."""
    text = client.get(keys.tool_definitions(tool_set))
    loaded = json.loads(text) if text else []
    return loaded if isinstance(loaded, list) else []


def submit(
    client: SyncRedis,
    keys: Keys,
    tool_set: str,
    *,
    run_id: str,
    call_id: str,
    tool: str,
    arguments: str,
    deadline: float,
) -> str:
    """Add one call for the set's servers; its stream entry id."""
    return client.xadd(
        keys.tool_calls(tool_set),
        {
            "run_id": run_id,
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "deadline": f"{deadline:.3f}",
        },
        maxlen=STREAM_MAXLEN,
    )


@dataclass(frozen=True)
class Taken:
    """A server took the call: its consumer name and when (unix time)."""

    server: str
    at: float


def wait_answer(
    client: SyncRedis, keys: Keys, run_id: str, call_id: str, deadline: float
) -> tuple[Reply | None, Taken | None]:
    """The call's answer (None when none came by ``deadline``, unix time), and which server
    took it last (None: none did)."""
    key = keys.tool_reply(run_id, call_id)
    taken = None
    while (remaining := deadline - time.time()) > 0:
        # BLPOP takes seconds with millisecond precision; 0 would mean "forever".
        popped = client.blpop([key], timeout=max(remaining, 0.01))
        if popped is None:
            break
        data = json.loads(popped[1])
        if "taken_by" in data:
            taken = Taken(str(data["taken_by"]), float(data.get("at") or 0))
            continue
        return Reply(bool(data.get("ok")), str(data.get("output", ""))), taken
    return None, taken


def wait_reply(
    client: SyncRedis, keys: Keys, run_id: str, call_id: str, deadline: float
) -> Reply | None:
    """The call's answer, or None when none came by ``deadline`` (unix time)."""
    return wait_answer(client, keys, run_id, call_id, deadline)[0]


def unanswered(tool_set: str, taken: Taken | None, waited_s: float) -> str:
    """What the harness is told of a call that got no answer in time: slow (a server took
    it) or not taken at all (no server is serving the set, or every one was busy)."""
    if taken is None:
        return (
            f"no server of tool set {tool_set} answered within {waited_s:g}s (none took the call)"
        )
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(taken.at))
    return (
        f"server {taken.server} of tool set {tool_set} took the call at {at} and did not "
        f"answer within {waited_s:g}s"
    )


def withdraw(client: SyncRedis, keys: Keys, tool_set: str, entry_id: str) -> None:
    """Drop a call nobody answered in time, so no server runs it late."""
    client.xdel(keys.tool_calls(tool_set), entry_id)


class ToolServer:
    """Answers one tool set's calls for every run that attached it, until stopped.

    ``tenant``: the set is that tenant's own, for its runs only (None: the set runs made
    without a tenant attach, and every tenant's when the operator shares its name). Several
    may serve one set (each a consumer of the set's group). ``concurrency``: how many calls
    :meth:`serve` answers at once (a call is taken only when one of them is free).
    ``lease_s`` is how long a claim of a server that stopped renewing it holds before another
    server takes the call.
    """

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        tool_set: str,
        tools: Mapping[str, Tool],
        *,
        tenant: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease_s: float = DEFAULT_LEASE_S,
        consumer: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be 1 to {MAX_CONCURRENCY}, not {concurrency}")
        self.client, self.keys, self.tool_set, self.tools = client, keys, tool_set, tools
        self.stored = owned(tenant, tool_set)
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.clock = clock
        self.stream = keys.tool_calls(self.stored)
        self.claims = _Claims(self)
        self._answered = 0
        self._count_lock = threading.Lock()
        self._ready = False
        """The group is there and the definitions published (made again after a loss)."""

    @property
    def answered(self) -> int:
        """Calls this server has answered."""
        return self._answered

    def serve(self, stop: threading.Event | None = None, *, block_s: float = 1.0) -> None:
        """Publish the set's definitions, then answer calls, up to ``concurrency`` at once,
        until ``stop`` is set; the calls under way are answered before it returns. Rides out
        Redis being away (it tries again every second)."""
        stop = stop or threading.Event()
        free = threading.BoundedSemaphore(self.concurrency)
        self._ready = False
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="tool-call") as pool:
            while not stop.is_set():
                if not free.acquire(timeout=block_s):
                    continue  # every slot busy: take nothing until one is free
                entry = self._take(stop, block_s)
                if entry is None:
                    free.release()
                    continue
                pool.submit(self._answer_then_free, entry, free)

    def serve_one(self, block_s: float) -> bool:
        """Take one call (a lapsed claim first, else a new one, waiting up to ``block_s``)
        and answer it before returning. False when there was none."""
        entry = self._lapsed() or self._next(block_s)
        if entry is None:
            return False
        self._handle(*entry)
        return True

    def _take(self, stop: threading.Event, block_s: float) -> StreamEntry | None:
        """One call to answer, or None (none came within ``block_s``, or Redis is away)."""
        try:
            if not self._ready:
                ensure_group(self.client, self.keys, self.stored)
                publish_definitions(self.client, self.keys, self.stored, self.tools)
                self._ready = True
            return self._lapsed() or self._next(block_s)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._ready = False  # the stream was removed: made again
        except REDIS_ERRORS:
            log.warning("tools.redis_unavailable", extra={"tool_set": self.stored})
            self._ready = False
            stop.wait(1.0)
        return None

    def _answer_then_free(self, entry: StreamEntry, free: threading.BoundedSemaphore) -> None:
        try:
            self._handle(*entry)
        except REDIS_ERRORS:
            # Unanswered, the call stays pending: taken again once its claim has lapsed.
            log.warning("tools.answer_not_sent", extra={"tool_set": self.stored})
        except Exception:
            log.exception("tools.call_failed", extra={"tool_set": self.stored})
        finally:
            free.release()

    def _lapsed(self) -> StreamEntry | None:
        reply = self.client.xautoclaim(
            self.stream, GROUP, self.consumer, int(self.lease_s * 1000), "0-0", count=1
        )
        claimed = reply[1] if len(reply) > 1 else []
        for entry_id, fields in claimed:
            if fields:  # an entry deleted meanwhile comes back without its fields
                log.info("tools.call_reclaimed", extra={"tool_set": self.stored})
                return entry_id, fields
        return None

    def _next(self, block_s: float) -> StreamEntry | None:
        got = self.client.xreadgroup(
            GROUP, self.consumer, {self.stream: ">"}, count=1, block=max(int(block_s * 1000), 1)
        )
        for _, entries in got or []:
            for entry_id, fields in entries:
                return entry_id, fields
        return None

    def _handle(self, entry_id: str, fields: Mapping[str, str]) -> None:
        run_id, call_id = fields.get("run_id", ""), fields.get("call_id", "")
        if self.clock() > float(fields.get("deadline") or 0):
            self._done(entry_id)  # the harness was told already: running it now helps nobody
            return
        key = self.keys.tool_reply(run_id, call_id)
        self.claims.hold(entry_id)
        try:
            taken = json.dumps({"taken_by": self.consumer, "at": round(self.clock(), 3)})
            self._push(key, taken)
            reply = self._run(fields.get("tool", ""), fields.get("arguments", "{}"))
        finally:
            self.claims.release(entry_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command("RPUSH", key, json.dumps({"ok": reply.ok, "output": reply.output}))
        pipe.expire(key, REPLY_TTL_S)
        pipe.execute_command("XACK", self.stream, GROUP, entry_id)
        pipe.execute_command("XDEL", self.stream, entry_id)
        pipe.execute()
        with self._count_lock:
            self._answered += 1

    def _push(self, key: str, text: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command("RPUSH", key, text)
        pipe.expire(key, REPLY_TTL_S)
        pipe.execute()

    def _run(self, name: str, arguments: str) -> Reply:
        found = self.tools.get(name)
        if found is None:
            return Reply(False, f"unknown tool {name!r} in tool set {self.tool_set}")
        try:
            parsed = json.loads(arguments)
            if not isinstance(parsed, dict):
                raise ToolError("the arguments are not a JSON object")
            return Reply(True, found.call(parsed))
        except ToolError as exc:
            return Reply(False, str(exc)[:ERROR_LIMIT])
        except Exception as exc:  # noqa: BLE001 (a handler's failure is the harness's answer)
            log.info("tools.handler_raised", extra={"tool_set": self.stored, "tool": name})
            return Reply(False, f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT])

    def _done(self, entry_id: str) -> None:
        self.client.xack(self.stream, GROUP, entry_id)
        self.client.xdel(self.stream, entry_id)


class _Claims:
    """The calls a server's handlers are answering, their claims renewed together (one
    XCLAIM) every third of the lease by one thread, which runs while any is held."""

    def __init__(self, server: ToolServer) -> None:
        self.server = server
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, entry_id: str) -> None:
        with self._lock:
            self._held.add(entry_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, name="tool-claims", daemon=True)
                self._thread.start()

    def release(self, entry_id: str) -> None:
        with self._lock:
            self._held.discard(entry_id)

    def _renew(self) -> None:
        server = self.server
        while True:
            time.sleep(server.lease_s / 3)
            with self._lock:
                held = sorted(self._held)
                if not held:
                    self._thread = None
                    return
            try:
                server.client.xclaim(server.stream, GROUP, server.consumer, 0, held, justid=True)
            except REDIS_ERRORS:
                log.warning("tools.claim_not_renewed", extra={"tool_set": server.stored})


class RedisToolSet:
    """The endpoint's side of a tool set (an :class:`~worker.tools.endpoint.Backend`): a
    call is submitted for the set's servers and waited for; one unanswered by its deadline
    is withdrawn and answered with an error. ``tenant`` is the run's: the set reached is
    that tenant's own, unless ``shared`` (the operator's shared sets) names it."""

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        run_id: str,
        tool_set: str,
        *,
        tenant: str | None = None,
        shared: Collection[str] = (),
    ) -> None:
        self.client, self.keys, self.run_id, self.tool_set = client, keys, run_id, tool_set
        self.stored = owned(tenant, tool_set, shared=shared)

    def list_tools(self) -> list[dict[str, Any]]:
        try:
            return definitions(self.client, self.keys, self.stored)
        except REDIS_ERRORS as exc:
            raise BackendError(f"tool set {self.tool_set} is unreachable: {exc}") from None

    def call(self, call_id: str, tool: str, arguments: dict[str, Any], deadline: float) -> Reply:
        try:
            return self._call(call_id, tool, arguments, deadline)
        except REDIS_ERRORS as exc:
            raise BackendError(f"tool set {self.tool_set} is unreachable: {exc}") from None

    def _call(self, call_id: str, tool: str, arguments: dict[str, Any], deadline: float) -> Reply:
        ensure_group(self.client, self.keys, self.stored)
        submitted = time.time()
        entry = submit(
            self.client, self.keys, self.stored, run_id=self.run_id, call_id=call_id,
            tool=tool, arguments=json.dumps(arguments), deadline=deadline,
        )  # fmt: skip
        reply, taken = wait_answer(self.client, self.keys, self.run_id, call_id, deadline)
        if reply is not None:
            return reply
        withdraw(self.client, self.keys, self.stored, entry)
        waited = round(max(deadline - submitted, 0), 1)
        return Reply(False, unanswered(self.tool_set, taken, waited))
