"""What stands behind one server attached to a run (:class:`Backend`), and its answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Reply:
    """The answer to one call: ``ok`` false for an error result (the handler raised or
    refused it, nothing answered in time)."""

    ok: bool
    output: str


class BackendError(Exception):
    """A backend could not be reached; the message is safe to show the harness."""


class Backend(Protocol):
    """A producer's tool set (:class:`worker.tools.calls.RedisToolSet`) or an operator's
    server (:class:`worker.tools.upstream.Upstream`). Both calls block (the endpoint runs
    them in threads) and raise nothing but :class:`BackendError`."""

    def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools, as MCP's ``tools/list`` lists them (``name``,
        ``description``, ``inputSchema``)."""

    def call(self, call_id: str, tool: str, arguments: dict[str, Any], deadline: float) -> Reply:
        """The answer, or an error reply; when nothing answered by ``deadline`` (unix
        time), an error reply that says so."""
