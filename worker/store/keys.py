"""Every Redis key name, in one place (docs/events.md, "Where events are")."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

#: What a Redis command takes as a value (redis-py encodes numbers itself).
Value: TypeAlias = str | int | float
#: One stream entry as ``decode_responses=True`` returns it: its id and its fields.
StreamEntry: TypeAlias = tuple[str, dict[str, str]]


class Script(Protocol):
    """A Lua script registered on a client (``register_script``): called by EVALSHA, loaded
    again by itself when Redis has forgotten it."""

    sha: str

    def __call__(self, keys: Sequence[str] = ..., args: Sequence[Value] = ...) -> Any: ...


class PooledConnection(Protocol):
    """One connection of a client's pool, used by hand to send a command and read its reply
    later (:class:`worker.store.lua.SentCall`)."""

    def send_command(self, *args: Value) -> None: ...

    def pack_commands(self, commands: Sequence[tuple[Value, ...]]) -> list[bytes]: ...

    def send_packed_command(self, command: list[bytes]) -> None: ...

    def read_response(self) -> Any: ...

    def disconnect(self) -> None: ...


class ConnectionPool(Protocol):
    def get_connection(self) -> PooledConnection: ...

    def release(self, connection: PooledConnection) -> None: ...


class SyncPipeline(Protocol):
    """The commands we queue on a pipeline; :meth:`execute` returns their replies in order."""

    def set(
        self, name: str, value: Value, ex: int | None = None, xx: bool = False
    ) -> SyncPipeline: ...

    def hset(
        self,
        name: str,
        key: str | None = None,
        value: Value | None = None,
        mapping: Mapping[str, Value] | None = None,
    ) -> SyncPipeline: ...

    def hgetall(self, name: str) -> SyncPipeline: ...

    def get(self, name: str) -> SyncPipeline: ...

    def exists(self, *names: str) -> SyncPipeline: ...

    def sadd(self, name: str, *values: str) -> SyncPipeline: ...

    def srem(self, name: str, *values: str) -> SyncPipeline: ...

    def delete(self, *names: str) -> SyncPipeline: ...

    def expire(self, name: str, time: int) -> SyncPipeline: ...

    def execute_command(self, *args: Value) -> SyncPipeline: ...

    def execute(self, raise_on_error: bool = True) -> list[Any]: ...


class RedisClient(Protocol):
    """A synchronous ``redis.Redis`` with ``decode_responses=True``, as we use it.

    redis-py annotates every command ``Awaitable[T] | T`` (one signature for its sync and
    asyncio clients), so its own class types correct synchronous code as errors. This is
    the subset of commands we call, with the replies a synchronous client returns. A
    ``redis.Redis`` (or ``fakeredis.FakeRedis``) becomes one where it is created: with a
    ``cast``, since it matches only at run time.
    """

    def execute_command(self, *args: Value) -> Any: ...

    def get(self, name: str) -> str | None: ...

    def set(
        self,
        name: str,
        value: Value,
        ex: int | None = None,
        px: int | None = None,
        nx: bool = False,
        xx: bool = False,
    ) -> bool | None: ...

    def delete(self, *names: str) -> int: ...

    def exists(self, *names: str) -> int: ...

    def expire(self, name: str, time: int) -> bool: ...

    def hgetall(self, name: str) -> dict[str, str]: ...

    def hset(
        self,
        name: str,
        key: str | None = None,
        value: Value | None = None,
        mapping: Mapping[str, Value] | None = None,
    ) -> int: ...

    def hkeys(self, name: str) -> list[str]: ...

    def hmget(self, name: str, keys: Sequence[str]) -> list[str | None]: ...

    def sadd(self, name: str, *values: str) -> int: ...

    def srem(self, name: str, *values: str) -> int: ...

    def smembers(self, name: str) -> builtins.set[str]: ...

    def sismember(self, name: str, value: str) -> bool: ...

    def rpush(self, name: str, *values: Value) -> int: ...

    def lrange(self, name: str, start: int, end: int) -> list[str]: ...

    def xrange(
        self, name: str, min: str = "-", max: str = "+", count: int | None = None
    ) -> list[StreamEntry]: ...

    def xrevrange(
        self, name: str, max: str = "+", min: str = "-", count: int | None = None
    ) -> list[StreamEntry]: ...

    def xread(
        self, streams: Mapping[str, str], count: int | None = None, block: int | None = None
    ) -> list[tuple[str, list[StreamEntry]]]: ...

    # The tool calls' stream and its consumer group (worker/tools/calls.py).
    def xadd(
        self,
        name: str,
        fields: Mapping[str, Value],
        id: str = "*",
        maxlen: int | None = None,
        approximate: bool = True,
        nomkstream: bool = False,
    ) -> str: ...

    def xgroup_create(
        self, name: str, groupname: str, id: str = "$", mkstream: bool = False
    ) -> bool: ...

    def xreadgroup(
        self,
        groupname: str,
        consumername: str,
        streams: Mapping[str, str],
        count: int | None = None,
        block: int | None = None,
    ) -> list[tuple[str, list[StreamEntry]]]: ...

    def xautoclaim(
        self,
        name: str,
        groupname: str,
        consumername: str,
        min_idle_time: int,
        start_id: str = "0-0",
        count: int | None = None,
    ) -> list[Any]: ...

    def xclaim(
        self,
        name: str,
        groupname: str,
        consumername: str,
        min_idle_time: int,
        message_ids: Sequence[str],
        justid: bool = False,
    ) -> list[Any]: ...

    def xack(self, name: str, groupname: str, *ids: str) -> int: ...

    def xdel(self, name: str, *ids: str) -> int: ...

    def blpop(self, keys: Sequence[str], timeout: float = 0) -> tuple[str, str] | None: ...

    def register_script(self, script: str) -> Script: ...

    @property
    def connection_pool(self) -> ConnectionPool: ...

    def transaction(self, func: Callable[[Any], None], *watches: str) -> list[Any]:
        """WATCH ``watches``, call ``func`` with the pipeline (it reads, then calls ``multi()``
        and queues its writes), EXEC; called again when a watched key changed meanwhile."""
        ...

    def pipeline(self, transaction: bool = True) -> SyncPipeline: ...

    def ping(self) -> bool: ...

    def close(self) -> None: ...


#: The synchronous client with ``decode_responses=True``, as our code uses it (the protocol
#: above; ``worker/store/redis_client.py``, ``worker/cli/doctor.py`` cast redis-py's client to it).
SyncRedis: TypeAlias = RedisClient


@dataclass(frozen=True)
class Keys:
    prefix: str = "harness"

    def run(self, run_id: str) -> str:
        """The run record (a hash)."""
        return f"{self.prefix}:run:{run_id}"

    def events(self, run_id: str) -> str:
        """The run's event stream; entry ids are ``{turn}-{seq}``."""
        return f"{self.prefix}:run:{run_id}:events"

    def run_long(self, run_id: str) -> str:
        """The record's fields that run long (``LONG_FIELDS`` of worker/store/records.py:
        the options, warnings, budget), one JSON object of their own: so that the record
        stays Redis's compact listpack, which holds values of up to 64 bytes by default."""
        return f"{self.prefix}:run:{run_id}:long"

    def transcript(self, run_id: str) -> str:
        """A list of the run's turns (input and final answer), replayed when resume fails."""
        return f"{self.prefix}:run:{run_id}:transcript"

    def turn_queued(self, run_id: str, turn: int) -> str:
        """The turn's payload while it waits to be taken: the reaper re-sends it from here if
        the broker loses its message (a worker killed while holding it)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:queued"

    def turn_started(self, run_id: str, turn: int) -> str:
        """Set once when a worker takes a turn: a redelivered turn never runs twice. Deleted
        when that worker ends the turn: its terminal refuses a later claim then
        (``claim_turn.lua``)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:started"

    def turn_silent(self, run_id: str, turn: int) -> str:
        """What the turn's harness was doing when it had been silent for long (JSON, with a
        TTL; worker/turn/stall.py): ``harness status`` shows it."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:silent"

    def turn_owner(self, run_id: str, turn: int) -> str:
        """The owning worker's heartbeat (expires when it dies)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:owner"

    def cancel(self, run_id: str, turn: int) -> str:
        return f"{self.prefix}:run:{run_id}:turn:{turn}:cancel"

    def credential(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:credential"

    def turn_messages(self, run_id: str, turn: int) -> str:
        """A list of the messages (JSON) sent to turn ``turn`` while it runs (``steer``,
        ``interrupt``): its worker takes them (worker/control/messages.py)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:messages"

    def inbox(self, run_id: str) -> str:
        """A list of the messages (JSON) that wait for the run's next turn (``queue``, and
        what an interrupt or an emulated steer carries over): the next turn's input."""
        return f"{self.prefix}:run:{run_id}:inbox"

    def messages_channel(self) -> str:
        """The pub/sub channel on which a sender says ``RUN_ID:TURN`` once it put a message
        in that turn's list or marked it cancelled: the worker holding the turn looks at
        once."""
        return f"{self.prefix}:messages"

    def inboxes(self) -> str:
        """A set of the run ids whose inbox may hold messages, for the reaper's backstop."""
        return f"{self.prefix}:inboxes"

    def group(self, group_id: str) -> str:
        """A hash of one group of attempts (``--attempts N``): ``runs`` (JSON list of run ids,
        in attempt order), ``tenant``, ``picked``, ``created_at``."""
        return f"{self.prefix}:group:{group_id}"

    def upload(self, run_id: str) -> str:
        """A list of the chunks of the archive a producer uploaded to seed the run (binary;
        deleted once the first turn has unpacked it, or expires)."""
        return f"{self.prefix}:run:{run_id}:upload"

    def attachment(self, run_id: str, turn: int, index: int) -> str:
        """A list of the chunks of one file a producer attached to a turn (binary; deleted
        once the worker has written it into the workspace, or expires)."""
        return f"{self.prefix}:run:{run_id}:turn:{turn}:attachment:{index}"

    def reply(self, run_id: str, request_id: str) -> str:
        """A list of the chunks of one diff, export or rewind reply (binary), read and
        emptied by the producer that asked, expiring if it went away."""
        return f"{self.prefix}:run:{run_id}:reply:{request_id}"

    def rewinds(self, run_id: str) -> str:
        """A list of rewinds done since the last turn (JSON): the next turn publishes each as
        a ``workspace`` event after its ``turn-started``."""
        return f"{self.prefix}:run:{run_id}:rewinds"

    def workspace_lock(self, run_id: str) -> str:
        """Held while a rewind rewrites the workspace: a turn waits for it to be released."""
        return f"{self.prefix}:run:{run_id}:workspace-lock"

    def permissions(self, run_id: str) -> str:
        """A hash of the run's permission requests (request id to JSON: tool, input, turn,
        deadline), pending or answered (worker/permissions/requests.py)."""
        return f"{self.prefix}:run:{run_id}:permissions"

    def permission_answers(self, run_id: str) -> str:
        """A hash of request id to its answer (JSON); the first answer written wins."""
        return f"{self.prefix}:run:{run_id}:permission-answers"

    def page_link(self, run_id: str, link_id: str) -> str:
        """A link to the run's page (a hash: the SHA-256 of its token, tenant, key id, mode,
        expiry; worker/api/links.py), expiring with it."""
        return f"{self.prefix}:run:{run_id}:link:{link_id}"

    def permission_always(self, run_id: str) -> str:
        """A set of fingerprints (tool and input) allowed for the rest of the run."""
        return f"{self.prefix}:run:{run_id}:permission-always"

    def tool_reply(self, run_id: str, call_id: str) -> str:
        """A list where the answer to one of the run's tool calls lands (JSON), read by the
        turn's endpoint; it expires (worker/tools/calls.py)."""
        return f"{self.prefix}:run:{run_id}:tool-reply:{call_id}"

    def tool_calls(self, tool_set: str) -> str:
        """A stream of the calls of one tool set (``--tools NAME``) for its servers to claim
        (consumer group ``servers``), whatever run made them. ``tool_set`` is the set's name
        as shared state knows it: a tenant's own set's is ``TENANT.NAME``
        (:func:`worker.options.tenant_names.owned`)."""
        return f"{self.prefix}:tools:{tool_set}:calls"

    def tool_definitions(self, tool_set: str) -> str:
        """The set's tools as its servers last published them (JSON: ``tools/list``);
        ``tool_set`` as in :meth:`tool_calls`."""
        return f"{self.prefix}:tools:{tool_set}:definitions"

    def run_keys(self, run_id: str) -> tuple[str, ...]:
        """Keys that share the run's retention."""
        return (
            self.run(run_id),
            self.run_long(run_id),
            self.events(run_id),
            self.transcript(run_id),
            self.inbox(run_id),
            self.rewinds(run_id),
            self.permissions(run_id),
            self.permission_answers(run_id),
            self.permission_always(run_id),
        )

    def slots(self, credential: str, part: str) -> str:
        """One part (``holders``, ``waiting``, ``who``, ``seen``) of the concurrency slots of
        a credential, named by a hash of its value (worker/spend/slots.py)."""
        return f"{self.prefix}:slots:{credential}:{part}"

    def slots_index(self) -> str:
        """A set of the credential hashes that have slots (for the reaper)."""
        return f"{self.prefix}:slots"

    def runs_index(self) -> str:
        """A set of run ids that may still hold a sandbox (for the reaper)."""
        return f"{self.prefix}:runs:active"

    def run_list(self, tenant: str, facet: str = "") -> str:
        """A sorted set of a tenant's run ids by creation time (``""``: runs made without a
        tenant); ``facet`` (``harness:H``, ``label:K=V``) names the subset of one filter
        (worker/store/listing.py)."""
        tail = f":{facet}" if facet else ""
        return f"{self.prefix}:tenant:{tenant}:runs{tail}"

    def tenant_key(self, tenant: str, part: str) -> str:
        """Per-tenant state of the HTTP API: ``rate:WINDOW`` (worker/api/limits.py)."""
        return f"{self.prefix}:tenant:{tenant}:{part}"

    def api_client(self, address: str, part: str) -> str:
        """Per client address of the HTTP API: ``auth-failures:WINDOW`` (worker/api/limits.py)."""
        return f"{self.prefix}:api-client:{address}:{part}"

    def hub_wake(self, hub_id: str) -> str:
        """The wake stream of one API process' SSE hub (worker/api/sse.py): an entry ends the
        hub's ``XREAD BLOCK`` at once, so that a run it starts watching is read without delay."""
        return f"{self.prefix}:api-hub:{hub_id}:wake"

    def webhooks(self, part: str) -> str:
        """The API's webhook deliveries (worker/api/webhooks.py): ``runs`` (watched run ids),
        ``cursor`` (run id to the last entry scanned), ``due`` (delivery ids by due time),
        ``body`` (delivery id to JSON)."""
        return f"{self.prefix}:webhooks:{part}"

    def triggers(self, part: str) -> str:
        """Inbound triggers and their deliveries (worker/triggers/store.py): ``trigger:ID``,
        ``names:TENANT``, ``deliveries:ID``, ``delivery:ID``, ``seen:ID:SHA256``."""
        return f"{self.prefix}:triggers:{part}"

    def hosts(self) -> str:
        """A hash of every host queue a worker ever announced (for the reaper's fan-out)."""
        return f"{self.prefix}:hosts"

    def host_alive(self, queue: str) -> str:
        """Set, with a short expiry, while a live worker consumes this queue (a host queue or
        a harness queue)."""
        return f"{self.prefix}:host:{queue}"

    def worker_alive(self, worker_id: str) -> str:
        """Set, with a short expiry, while this worker process is up and consuming."""
        return f"{self.prefix}:worker:{worker_id}"

    def schedule(self, owned: str) -> str:
        """A hash: one schedule (``spec`` JSON, and its state: paused, failures, last
        firing); ``owned`` is its name as :func:`worker.options.tenant_names.owned` makes it
        (worker/schedules/)."""
        return f"{self.prefix}:schedule:{owned}"

    def schedule_history(self, owned: str) -> str:
        """A list of the schedule's firings, newest first, bounded."""
        return f"{self.prefix}:schedule:{owned}:history"

    def schedule_tick(self, owned: str, generation: str, tick: int) -> str:
        """Set once (``NX``, with a TTL) by the one worker that fires that tick."""
        return f"{self.prefix}:schedule:{owned}:{generation}:tick:{tick}"

    def schedules_due(self) -> str:
        """A sorted set of active schedules (owned names) by their next fire time."""
        return f"{self.prefix}:schedules:due"

    def schedule_names(self, tenant: str) -> str:
        """A set of a tenant's schedule names (``""``: those made without a tenant)."""
        return f"{self.prefix}:tenant:{tenant}:schedules"

    def reaper_lock(self, scope: str) -> str:
        """Held by the worker running a reaper pass over ``scope`` (``fleet`` or a host
        queue), so that passes over the same things never overlap."""
        return f"{self.prefix}:reaper:{scope}"
