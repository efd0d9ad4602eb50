"""What a turn asks of the tools: is the run's attachment allowed, and the turn's endpoint.

A run that attached servers (``--tools``, ``--mcp``) gets, each turn, its endpoint served in
its HOME's ``.harness-endpoint`` directory (the socket and the bridge, written on the worker's
host side of the run's workspace) and one :class:`~adapters.protocol.McpServer` per attached
server for the adapter to configure: the bridge, run with the sandbox's ``python3``.

The worker runs as root and the harness owns its HOME: it can turn any name there into a link
to a host path, before a turn or while one runs. So the directory is reached and written only
through descriptors that follow no link (:mod:`sandbox.store.safe_fs`): HOME is opened one
component at a time, ``.harness-endpoint`` is the worker's own directory (root's, 0755: the
harness can rename it, never change what is in it), and anything else found at that name is
put out of the way unfollowed (:func:`~sandbox.store.safe_fs.own_directory`) rather than
refused, so that a run whose harness broke it once is not refused its tools on every later
turn. The descriptor stays open for the turn: the socket is bound and removed through it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import adapters
from adapters.asks import Ask
from adapters.events import Event, SandboxActivity
from adapters.protocol import McpServer
from config import Settings
from sandbox.base import Placement, UnsafePath
from sandbox.store import safe_fs
from worker.deps import TurnDeps
from worker.errors import InvalidInput
from worker.observe.masking import Masker
from worker.options.spec import RunOptions
from worker.permissions import rules
from worker.store import credentials
from worker.store.credentials import CREDENTIAL_ENV
from worker.tools import bridge
from worker.tools.asking import EndpointAsk
from worker.tools.backend import Backend, BackendError, Reply
from worker.tools.calls import RedisToolSet
from worker.tools.endpoint import RunEndpoint, RunTools, ToolLimits
from worker.tools.upstream import Upstream

log = logging.getLogger(__name__)

DIRECTORY = ".harness-endpoint"
"""Inside the run's HOME: the endpoint's socket and the bridge, in a directory of the
worker's (adapters write their own files under ``.harness``, as the sandbox's user)."""
SOCKET = "mcp.sock"
BRIDGE = "mcp-bridge.py"
BRIDGE_SOURCE = Path(bridge.__file__).read_text()


class EndpointRefused(Exception):
    """The turn's endpoint cannot be made in the run's HOME without following a link of the
    sandbox's (or at all): the turn is refused with this message, before its harness starts."""


def check(options: RunOptions, settings: Settings) -> None:
    """Refuse servers the operator did not name and a harness that cannot load any."""
    unknown = [name for name in options.mcp if name not in settings.mcp_servers]
    if unknown:
        named = ", ".join(sorted(settings.mcp_servers)) or "none"
        raise InvalidInput(
            f"--mcp {', '.join(unknown)}: not an MCP server of the operator's "
            f"(HARNESS_MCP_SERVERS names: {named})"
        )
    if (options.tools or options.mcp) and not adapters.get(options.harness).CAPABILITIES.mcp_client:
        raise InvalidInput(
            f"{options.harness} cannot load MCP servers here (capability mcp_client is false): "
            "attach tools to another harness"
        )


@dataclass
class TurnTools:
    """The turn's open endpoint and the servers the adapter is to configure."""

    endpoint: RunEndpoint
    servers: tuple[McpServer, ...]

    def drain(self) -> list[Event]:
        return self.endpoint.drain()


@contextlib.contextmanager
def serve(
    deps: TurnDeps,
    run_id: str,
    turn: int,
    options: RunOptions,
    placement: Placement,
    workspace: Path,
    masker: Masker,
    *,
    tenant: str | None = None,
) -> Iterator[TurnTools | None]:
    """The turn's endpoint while the block runs (None when the run attached nothing).
    ``workspace`` is the run's workspace on this host (``placement.workspace`` is where the
    harness sees it); ``tenant`` the run's (its tool sets are that tenant's own)."""
    if not options.tools and not options.mcp:
        yield None
        return
    home = str(PurePosixPath(placement.home).relative_to(placement.workspace))
    directory, displaced = endpoint_directory(workspace, home)
    try:
        endpoint, servers = _open(
            deps, run_id, turn, options, placement, workspace, masker, directory, tenant
        )
        for what in displaced:
            log.warning("tools.endpoint_replaced", extra={"run_id": run_id, "found": what})
            endpoint.put(
                SandboxActivity(
                    kind="tool",
                    description=f"{home}/{DIRECTORY} was not the worker's ({what}): it was "
                    "put out of the way without being followed",
                )
            )
        try:
            yield TurnTools(endpoint, servers)
        finally:
            endpoint.close()
    finally:
        os.close(directory)


def endpoint_directory(workspace: Path, home: str) -> tuple[int, list[str]]:
    """The endpoint's directory in HOME, the worker's own, open and holding the bridge; what
    was found at its name instead. The model gateway's socket and relay live there too
    (worker/gateway/route.py)."""
    try:
        parent = safe_fs.open_dir(workspace, home)
    except UnsafePath as exc:
        raise EndpointRefused(
            f"the run's MCP endpoint is not served: its HOME ({home}) is not a directory "
            f"the worker can open without following a link ({exc})"
        ) from exc
    try:
        directory, displaced = safe_fs.own_directory(parent, DIRECTORY, 0o755)
    except UnsafePath as exc:
        raise _refused(home, exc) from exc
    finally:
        os.close(parent)
    try:
        safe_fs.put_file(directory, BRIDGE, BRIDGE_SOURCE.encode(), 0o644)
    except UnsafePath as exc:
        os.close(directory)
        raise _refused(home, exc) from exc
    return directory, displaced


def _refused(home: str, exc: UnsafePath) -> EndpointRefused:
    return EndpointRefused(f"the run's MCP endpoint is not served: {home}/{DIRECTORY}: {exc}")


def _open(
    deps: TurnDeps,
    run_id: str,
    turn: int,
    options: RunOptions,
    placement: Placement,
    workspace: Path,
    masker: Masker,
    directory: int,
    tenant: str | None,
) -> tuple[RunEndpoint, tuple[McpServer, ...]]:
    """The turn's endpoint, open in ``directory``, and the servers it serves."""
    settings = deps.settings
    home = PurePosixPath(placement.home).relative_to(placement.workspace)
    inside = f"{placement.home}/{DIRECTORY}"
    backends: dict[str, Backend] = {
        name: RedisToolSet(
            deps.redis, deps.keys, run_id, name, tenant=tenant, shared=settings.shared_tool_sets
        )
        for name in options.tools
    }
    for name in options.mcp:
        backends[name] = Upstream(name, settings.mcp_servers[name])
    guarded = {name: _Denying(name, b, options.deny) for name, b in backends.items()}
    asker = _asker(deps, run_id, turn, options, masker)
    endpoint = RunEndpoint(
        RunTools(
            run_id=run_id,
            turn=turn,
            socket_path=workspace / home / DIRECTORY / SOCKET,
            directory=directory,
            servers=guarded,
            verify=lambda token: credentials.verify(deps.redis, deps.keys, run_id, token),
            masker=masker,
            limits=ToolLimits(
                settings.tool_call_timeout_s,
                settings.tool_result_max_chars,
                settings.tool_calls_in_flight,
            ),
            ask=asker,
        )
    )
    if asker is not None:
        asker.put = endpoint.put
    servers = tuple(
        McpServer(
            name,
            ("python3", f"{inside}/{BRIDGE}", f"{inside}/{SOCKET}", name),
            env=(CREDENTIAL_ENV,),
            tools=_tool_names(backend),
        )
        for name, backend in guarded.items()
    )
    try:
        endpoint.open()
    except UnsafePath as exc:
        endpoint.close()
        raise _refused(str(home), exc) from exc
    return endpoint, servers


def _asker(
    deps: TurnDeps, run_id: str, turn: int, options: RunOptions, masker: Masker
) -> EndpointAsk | None:
    """Under ``--posture ask``, for a harness that does not ask for MCP calls itself."""
    if options.posture != "ask" or adapters.get(options.harness).CAPABILITIES.mcp_ask:
        return None
    return EndpointAsk(
        deps.redis, deps.keys, run_id, turn, timeout_s=deps.settings.permission_timeout_s,
        masker=masker, put=lambda event: None, allow=options.allow, deny=options.deny,
    )  # fmt: skip


def _tool_names(backend: Backend) -> tuple[str, ...]:
    try:
        listed = backend.list_tools()
    except BackendError as exc:
        log.warning("tools.list_failed", extra={"error": str(exc)})
        return ()
    return tuple(str(t.get("name")) for t in listed if isinstance(t.get("name"), str))


class _Denying:
    """A backend behind the run's ``--deny`` patterns: a call they match is refused. A tool
    is named as the CLIs name it (``mcp__SERVER__TOOL``, ``SERVER_TOOL``) or plainly."""

    def __init__(self, server: str, backend: Backend, deny: tuple[str, ...]) -> None:
        self.server, self.backend, self.deny = server, backend, deny

    def list_tools(self) -> list[dict[str, object]]:
        return self.backend.list_tools()

    def call(self, call_id: str, tool: str, arguments: dict[str, object], deadline: float) -> Reply:
        for name in (f"mcp__{self.server}__{tool}", f"{self.server}_{tool}", tool):
            pattern = rules.first_match(
                self.deny, Ask(native_id=call_id, tool=name, input=arguments)
            )
            if pattern is not None:
                return Reply(False, f"Denied by the run's rule {pattern}.")
        return self.backend.call(call_id, tool, arguments, deadline)
