"""An operator's MCP server for the tests: streamable HTTP on 127.0.0.1:PORT (argv[1]) that
answers only requests carrying ``Authorization: Bearer TOKEN`` (argv[2])."""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("ops")


@server.tool()
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def main() -> None:
    port, token = int(sys.argv[1]), sys.argv[2].encode()
    app = server.streamable_http_app()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and dict(scope["headers"]).get(b"authorization") != b"Bearer " + token
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
