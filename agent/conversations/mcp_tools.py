"""MCP tool servers of a conversation (official ``mcp`` SDK).

Each server lives in its own asyncio task, because the SDK's transports are anyio
context managers that must be entered and left by the same task. stdio servers are
child processes (their env = the server's ``env`` over a minimal safe environment);
sse and shttp servers get ``Authorization: Bearer <api_key>`` when a key is set.
Tools of stdio servers are offered as ``<server>__<tool>``, the others by their own name.
The SDK takes ~0.4 s to import: this module is imported only for conversations with MCP servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from .events import tool_definition
from .failures import describe_error
from .mcp_config import MCPConfig, MCPRemoteServer, MCPStdioServer

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
CALL_TIMEOUT = 600.0
CLOSE_TIMEOUT = 5.0
MAX_TOOL_PAGES = 20
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")

Streams = tuple[Any, Any]
Opener = Callable[[AsyncExitStack], Awaitable[Streams]]


def tool_text(result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            parts.append(getattr(block.resource, "text", None) or "[binary resource omitted]")
        else:
            parts.append(f"[{block.type} content omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


class _Server:
    """One connected MCP server, kept open by its own task until :meth:`close`."""

    def __init__(self, label: str, opener: Opener, call_timeout: float) -> None:
        self.label = label
        self.call_timeout = call_timeout
        self._opener = opener
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.session: ClientSession | None = None

    async def start(self, timeout: float) -> list[mcp_types.Tool]:
        ready: asyncio.Future[list[mcp_types.Tool]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(ready), name=f"mcp:{self.label}")
        try:
            return await asyncio.wait_for(asyncio.shield(ready), timeout)
        except BaseException:
            await self.close()
            raise

    async def _run(self, ready: asyncio.Future[list[mcp_types.Tool]]) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._opener(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools = await _list_tools(session)
                self.session = session
                ready.set_result(tools)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("MCP server %s stopped: %s", self.label, describe_error(exc))
        finally:
            self.session = None
            if not ready.done():
                ready.cancel()

    async def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        if self.session is None:
            raise RuntimeError(f"MCP server {self.label} is not connected")
        return await self.session.call_tool(name, arguments, read_timeout_seconds=self.call_timeout)

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT)
        except (TimeoutError, Exception):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


def _stdio_opener(server: MCPStdioServer, cwd: Path, errlog: TextIO) -> Opener:
    params = StdioServerParameters(
        command=server.command, args=list(server.args), env=dict(server.env), cwd=cwd
    )

    async def open_(stack: AsyncExitStack) -> Streams:
        return await stack.enter_async_context(stdio_client(params, errlog=errlog))

    return open_


def _sse_opener(server: MCPRemoteServer) -> Opener:
    async def open_(stack: AsyncExitStack) -> Streams:
        timeout = server.timeout or START_TIMEOUT
        streams = sse_client(server.url, headers=server.request_headers(), timeout=timeout)
        return await stack.enter_async_context(streams)

    return open_


def _shttp_opener(server: MCPRemoteServer) -> Opener:
    async def open_(stack: AsyncExitStack) -> Streams:
        timeout = httpx2.Timeout(server.timeout or START_TIMEOUT, read=CALL_TIMEOUT)
        client = await stack.enter_async_context(
            httpx2.AsyncClient(headers=server.request_headers(), timeout=timeout)
        )
        streams = await stack.enter_async_context(
            streamable_http_client(server.url, http_client=client)
        )
        return streams[0], streams[1]

    return open_


@dataclass(frozen=True)
class _Tool:
    server: _Server
    name: str  # as the server knows it
    spec: dict[str, Any]


class MCPManager:
    """The MCP servers of one conversation and the tools they offer."""

    def __init__(self, config: MCPConfig, working_dir: Path, log_dir: Path | None) -> None:
        self._config = config
        self._working_dir = working_dir
        self._log_dir = log_dir
        self._servers: list[_Server] = []
        self._tools: dict[str, _Tool] = {}
        self._logs: list[TextIO] = []

    def _errlog(self, name: str) -> TextIO:
        path = self._log_dir / f"mcp-{name}.log" if self._log_dir else Path(os.devnull)
        handle = path.open("a", encoding="utf-8")
        self._logs.append(handle)
        return handle

    def _plan(self) -> list[tuple[str, str | None, Opener, float]]:
        """(label, tool prefix, opener, start timeout) of every configured server."""
        plan: list[tuple[str, str | None, Opener, float]] = []
        for stdio in self._config.stdio_servers:
            opener = _stdio_opener(stdio, self._working_dir, self._errlog(stdio.name))
            plan.append((stdio.name, stdio.name, opener, START_TIMEOUT))
        for remote in self._config.remote_servers:
            opener = _sse_opener(remote) if remote.is_sse else _shttp_opener(remote)
            plan.append((remote.name, None, opener, remote.timeout or START_TIMEOUT))
        return plan

    async def start(self) -> list[str]:
        """Connect every server concurrently; returns one message per server that failed."""
        plan = self._plan()
        servers = [_Server(label, opener, CALL_TIMEOUT) for label, _, opener, _ in plan]
        results = await asyncio.gather(
            *(s.start(timeout) for s, (_, _, _, timeout) in zip(servers, plan, strict=True)),
            return_exceptions=True,
        )
        errors: list[str] = []
        for server, (label, prefix, _, _), result in zip(servers, plan, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(f"MCP server {label} failed to start: {describe_error(result)}")
                continue
            self._servers.append(server)
            for tool in result:
                self._add_tool(server, prefix, tool)
        return errors

    def _add_tool(self, server: _Server, prefix: str | None, tool: mcp_types.Tool) -> None:
        exposed = _UNSAFE.sub("_", f"{prefix}__{tool.name}" if prefix else tool.name)[:64]
        if exposed in self._tools:
            log.warning("MCP tool %s of %s ignored: the name is taken", exposed, server.label)
            return
        schema = tool.input_schema or {"type": "object", "properties": {}}
        function = {"name": exposed, "description": tool.description or "", "parameters": schema}
        spec = {"type": "function", "function": function}
        self._tools[exposed] = _Tool(server, tool.name, spec)

    def specs(self, reserved: set[str]) -> list[dict[str, Any]]:
        return [tool.spec for name, tool in self._tools.items() if name not in reserved]

    def definitions(self, reserved: set[str]) -> list[dict[str, Any]]:
        """SDK ``MCPToolDefinition`` dumps of the tools (for the SystemPromptEvent)."""
        out = []
        for name, tool in self._tools.items():
            if name in reserved:
                continue
            function = tool.spec["function"]
            mcp_tool = {
                "name": name,
                "description": function["description"],
                "inputSchema": function["parameters"],
            }
            out.append(
                tool_definition(
                    "MCPToolDefinition",
                    name,
                    function["description"],
                    "MCPToolAction",
                    "MCPToolObservation",
                    mcp_tool=mcp_tool,
                )
            )
        return out

    def has(self, name: str) -> bool:
        return name in self._tools

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Call a tool: (its text content, whether the server reported an error)."""
        tool = self._tools[name]
        result = await tool.server.call(tool.name, arguments)
        return tool_text(result), result.is_error

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._servers), return_exceptions=True)
        self._servers.clear()
        self._tools.clear()
        for handle in self._logs:
            handle.close()
        self._logs.clear()
