"""MCP servers of a conversation, from the SDK's ``agent.mcp_config`` (docs/agent-protocol.md).

The SDK sends fastmcp's configuration: ``{"mcpServers": {name: server}}`` where a server is
either ``{"command", "args", "env"}`` (stdio) or ``{"url", "transport", "headers", "auth"}``
(``transport`` ``"sse"``, or ``"http"``/``"streamable-http"``; without one, a URL whose path
ends in ``/sse`` is SSE, any other streamable HTTP, as fastmcp infers it). ``auth`` is a bearer
token. Other keys are ignored.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")


class MCPRemoteServer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    url: str = Field(min_length=1, max_length=2048)
    transport: Literal["sse", "http", "streamable-http"] | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    auth: str | None = None
    timeout: float | None = Field(default=None, gt=0, le=3600)

    @property
    def is_sse(self) -> bool:
        if self.transport is not None:
            return self.transport == "sse"
        return urlsplit(self.url).path.rstrip("/").endswith("/sse")

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.auth and self.auth != "oauth":
            headers["Authorization"] = f"Bearer {self.auth}"
        return headers


class MCPStdioServer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64)
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SERVER_NAME.match(value):
            raise ValueError("Server name can only contain letters, numbers, hyphens, underscores")
        return value


class MCPConfig(BaseModel):
    stdio_servers: list[MCPStdioServer] = Field(default_factory=list)
    remote_servers: list[MCPRemoteServer] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.stdio_servers or self.remote_servers)

    def secret_values(self) -> list[str]:
        values: list[str] = []
        for remote in self.remote_servers:
            values.extend(remote.headers.values())
            if remote.auth:
                values.append(remote.auth)
        for server in self.stdio_servers:
            values.extend(server.env.values())
        return [v for v in values if v]


def parse_mcp_servers(config: dict[str, Any]) -> MCPConfig:
    """Our view of ``{"mcpServers": {...}}``; ValueError naming the server when one is bad."""
    servers = config.get("mcpServers") or {}
    if not isinstance(servers, dict):
        raise ValueError("mcp_config.mcpServers must be an object of named servers")
    parsed = MCPConfig()
    for name, raw in servers.items():
        if not isinstance(raw, dict):
            raise ValueError(f"MCP server {name!r} must be an object")
        try:
            if raw.get("command") is not None:
                parsed.stdio_servers.append(MCPStdioServer.model_validate({**raw, "name": name}))
            elif raw.get("url") is not None:
                parsed.remote_servers.append(MCPRemoteServer.model_validate({**raw, "name": name}))
            else:
                raise ValueError("it needs a command (stdio) or a url")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"MCP server {name!r}: {problems}") from None
        except ValueError as exc:
            raise ValueError(f"MCP server {name!r}: {exc}") from None
    return parsed
