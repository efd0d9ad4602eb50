"""An MCP server the operator names (``HARNESS_MCP_SERVERS``), behind the run's endpoint.

The endpoint forwards the harness's ``tools/list`` and ``tools/call`` to the server over
streamable HTTP with the operator's headers (its credentials): the harness talks only to our
endpoint, so the headers never enter its sandbox, and they are never logged or published
(errors are told by their kind and status, never with a request's headers). One MCP session
per request, opened from the endpoint's thread for it: a forwarded call holds nothing
between calls.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from config.settings import McpUpstream
from worker.tools.backend import BackendError, Reply

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


class Upstream:
    """A :class:`~worker.tools.backend.Backend` for one operator server."""

    def __init__(self, name: str, config: McpUpstream) -> None:
        self.name, self.config = name, config

    def list_tools(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = self._run(self._list, time.time() + 30)
        return listed

    def call(self, call_id: str, tool: str, arguments: dict[str, Any], deadline: float) -> Reply:
        reply: Reply = self._run(lambda session: self._call(session, tool, arguments), deadline)
        return reply

    def _run(self, work: Any, deadline: float) -> Any:
        """``work(session)`` in a fresh session, by ``deadline``; blocks (a thread's own
        event loop)."""

        async def in_session() -> Any:
            timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=max(deadline - time.time(), 0.1))
            http = create_mcp_http_client(headers=dict(self.config.headers), timeout=timeout)
            with anyio.fail_after(max(deadline - time.time(), 0.1)):
                async with (
                    http,
                    streamable_http_client(self.config.url, http_client=http) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    return await work(session)

        try:
            return anyio.run(in_session)
        except TimeoutError:
            raise BackendError(f"MCP server {self.name} did not answer in time") from None
        except Exception as exc:  # noqa: BLE001 (told by its kind: never with the headers)
            kind = _kind(exc)
            log.warning("tools.upstream_failed", extra={"server": self.name, "error": kind})
            raise BackendError(f"MCP server {self.name} is unreachable ({kind})") from None

    async def _list(self, session: ClientSession) -> list[dict[str, Any]]:
        listed = await session.list_tools()
        return [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools]

    async def _call(self, session: ClientSession, tool: str, arguments: dict[str, Any]) -> Reply:
        result = await session.call_tool(tool, arguments)
        parts = [getattr(block, "text", None) for block in result.content]
        text = "\n".join(p for p in parts if isinstance(p, str))
        if not text and result.structured_content is not None:
            text = str(result.structured_content)
        return Reply(not result.is_error, text)


def _kind(exc: BaseException) -> str:
    """What went wrong, without a request's headers: the first leaf of an exception group,
    by its class, and an HTTP status."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return f"{type(exc).__name__}, HTTP {status}" if status else type(exc).__name__
