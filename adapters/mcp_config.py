"""The run's MCP servers (:class:`~adapters.protocol.McpServer`) in the shapes the harnesses
read: the common ``{"mcpServers": {NAME: {"command", "args", "env"}}}`` file (stdio-json's
``HARNESS_MCP_CONFIG``, Claude Code's ``--mcp-config``, Gemini's settings), and the names
each CLI gives an attached tool. Pure: text in, text out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from adapters.protocol import McpServer

COMMON_FILE = ".harness-mcp.json"
"""Where, in the run's HOME, an adapter writes the common-shape file it points its harness
at (HOME itself is the sandbox user's; the endpoint's own directory is the worker's)."""


def common(
    servers: Iterable[McpServer], env_value: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """The common shape. ``env_value`` says how the file passes an inherited variable on
    (Claude Code expands ``${NAME}``); without it ``env`` is empty and the server inherits
    the harness's environment as it is."""
    shaped: dict[str, Any] = {}
    for server in servers:
        entry: dict[str, Any] = {"command": server.command[0], "args": list(server.command[1:])}
        entry["env"] = {name: env_value(name) for name in server.env} if env_value else {}
        shaped[server.name] = entry
    return {"mcpServers": shaped}


def common_json(servers: Iterable[McpServer], env_value: Callable[[str], str] | None = None) -> str:
    return json.dumps(common(servers, env_value), indent=2, sort_keys=True)
