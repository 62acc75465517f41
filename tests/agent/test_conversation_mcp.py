"""MCP tools: a real stdio server (child process) and real HTTP servers (shttp, sse)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.conversations.masking import MASK
from tests.agent.conv_helpers import BASE, events, of_kind, start, wait_status
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_calls, tool_call
from tests.support.types import Client

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
MCP_TIMEOUT = 60.0


def stdio_server(**env: str) -> dict[str, object]:
    """An ``mcpServers`` entry (fastmcp's shape, as the SDK sends ``agent.mcp_config``)."""
    return {"command": sys.executable, "args": [SERVER], "env": env}


def mcp_result(observation: dict[str, Any]) -> tuple[str, bool]:
    assert observation["kind"] == "MCPToolObservation"
    return "".join(p["text"] for p in observation["content"]), observation["is_error"]


def processes_with_env(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


async def test_stdio_server_tools_are_offered_and_called(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    marker = f"acs-test-{uuid.uuid4().hex}"
    local_fake_llm.script(
        [
            reply_tool_calls(
                tool_call("calc__add", {"a": 2, "b": 3}),
                tool_call("calc__env_value", {"name": "CALC_TOKEN"}),
                tool_call("calc__fail", {}),
            ),
            reply_finish(),
        ]
    )
    servers = {"calc": stdio_server(CALC_TOKEN="tok-secret-1", MARKER=marker)}
    cid = (await start(agent_client, auth, local_fake_llm, mcp_servers=servers))["id"]
    done = await wait_status(agent_client, auth, cid, timeout=MCP_TIMEOUT)
    assert done["execution_status"] == "finished"

    tools = {t["function"]["name"]: t["function"] for t in local_fake_llm.requests[0].body["tools"]}
    assert {"calc__add", "calc__env_value", "calc__fail", "terminal"} <= set(tools)
    assert tools["calc__add"]["description"] == "Add two integers."
    assert tools["calc__add"]["parameters"]["required"] == ["a", "b"]

    items = await events(agent_client, auth, cid)
    observations = [e["observation"] for e in of_kind(items, "ObservationEvent")]
    assert mcp_result(observations[0]) == ("5", False)
    assert mcp_result(observations[1]) == (MASK, False)  # stdio env values are secrets
    text, is_error = mcp_result(observations[2])
    assert is_error
    assert "Error executing tool fail" in text
    assert observations[0]["tool_name"] == "calc__add"
    actions = [e["action"] for e in of_kind(items, "ActionEvent")]
    assert actions[0] == {"kind": "MCPToolAction", "data": {"a": 2, "b": 3}}
    (prompt,) = of_kind(items, "SystemPromptEvent")
    definitions = {t["title"]: t for t in prompt["tools"]}
    assert definitions["calc__add"]["kind"] == "MCPToolDefinition"
    assert definitions["calc__add"]["mcp_tool"]["inputSchema"]["required"] == ["a", "b"]
    assert of_kind(items, "ConversationErrorEvent") == []
    assert processes_with_env(marker)  # the server runs until the conversation is deleted

    resp = await agent_client.delete(f"{BASE}/{cid}", headers=auth)
    assert resp.status == 200
    async with asyncio.timeout(10):
        while processes_with_env(marker):  # noqa: ASYNC110 - polling /proc, no event to await
            await asyncio.sleep(0.05)


async def test_a_server_that_fails_to_start_is_an_mcp_error(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script(
        [reply_tool_calls(tool_call("calc__add", {"a": 1, "b": 1})), reply_finish()]
    )
    servers = {"broken": {"command": "/nonexistent/mcp-server", "args": []}, "calc": stdio_server()}
    cid = (await start(agent_client, auth, local_fake_llm, mcp_servers=servers))["id"]
    done = await wait_status(agent_client, auth, cid, timeout=MCP_TIMEOUT)
    assert done["execution_status"] == "finished"
    items = await events(agent_client, auth, cid)
    errors = of_kind(items, "ConversationErrorEvent")
    assert [e["code"] for e in errors] == ["MCPError"]
    assert "MCP server broken failed to start" in errors[0]["detail"]
    assert mcp_result(of_kind(items, "ObservationEvent")[0]["observation"]) == ("2", False)
    names = {t["function"]["name"] for t in local_fake_llm.requests[0].body["tools"]}
    assert not any(n.startswith("broken__") for n in names)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(params=["shttp", "sse"])
def http_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(kind, url) of an MCP server running in a child process."""
    kind: str = request.param
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, kind, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with socket.socket() as probe:
            for _ in range(300):
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
                assert proc.poll() is None, "the MCP server exited"
                time.sleep(0.05)
            else:
                raise AssertionError("the MCP server did not listen within 15 s")
        path = "/mcp" if kind == "shttp" else "/sse"
        yield kind, f"http://127.0.0.1:{port}{path}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_http_servers_get_the_bearer_key(
    agent_client: Client,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    http_server: tuple[str, str],
) -> None:
    kind, url = http_server
    local_fake_llm.script(
        [
            reply_tool_calls(tool_call("add", {"a": 20, "b": 22}), tool_call("authorization", {})),
            reply_finish(),
        ]
    )
    # No transport: inferred from the URL (/sse is SSE, the rest streamable HTTP).
    servers = {kind: {"url": url, "auth": "mcp-key-xyz"}}
    cid = (await start(agent_client, auth, local_fake_llm, mcp_servers=servers))["id"]
    done = await wait_status(agent_client, auth, cid, timeout=MCP_TIMEOUT)
    assert done["execution_status"] == "finished"
    items = await events(agent_client, auth, cid)
    assert of_kind(items, "ConversationErrorEvent") == []
    observations = [e["observation"] for e in of_kind(items, "ObservationEvent")]
    assert mcp_result(observations[0]) == ("42", False)
    assert mcp_result(observations[1]) == (f"Bearer {MASK}", False)
