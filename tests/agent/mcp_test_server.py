"""A small MCP server for the tests, written with the official SDK.

python mcp_test_server.py                  # stdio
python mcp_test_server.py shttp PORT       # streamable HTTP on 127.0.0.1:PORT/mcp
python mcp_test_server.py sse PORT         # SSE on 127.0.0.1:PORT/sse
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")
last_authorization: list[str] = []


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def env_value(name: str) -> str:
    """The value of an environment variable of the server process ("" when unset)."""
    return os.environ.get(name, "")


@server.tool()
def authorization() -> str:
    """The Authorization header of the last HTTP request ("" over stdio)."""
    return last_authorization[-1] if last_authorization else ""


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ValueError("boom")


def with_header_capture(app: Any) -> Any:
    async def capture(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            last_authorization.append(headers.get(b"authorization", b"").decode())
        await app(scope, receive, send)

    return capture


def main() -> None:
    if len(sys.argv) == 1:
        server.run()
        return
    import uvicorn  # noqa: PLC0415 - only the HTTP modes need it

    mode, port = sys.argv[1], int(sys.argv[2])
    app = server.streamable_http_app() if mode == "shttp" else server.sse_app()
    uvicorn.run(with_header_capture(app), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
