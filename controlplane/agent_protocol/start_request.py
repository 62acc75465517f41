"""The body of ``POST /api/conversations`` on a sandbox's agent server: the OpenHands SDK's
``StartConversationRequest`` (openhands-sdk 1.21 / agent server 1.58), which our agent and the
official agent server both take (docs/agent-protocol.md)."""

from __future__ import annotations

from typing import Any

from controlplane.settings.mcp import MCPConfig
from controlplane.specs.models import AgentKind

#: The tools, by the names agent server 1.58 registers them (`TerminalTool` etc. are unknown
#: there); our agent takes both spellings and has no task tracker (it ignores that one).
AGENT_TOOLS = ("terminal", "file_editor", "task_tracker")
#: The control plane's LLM retry policy (the SDK's defaults wait minutes before giving up).
LLM_RETRIES = {"num_retries": 3, "retry_min_wait": 2, "retry_max_wait": 30}


def mcp_servers(config: MCPConfig, agent_kind: AgentKind = "acs") -> dict[str, Any]:
    """The user's MCP settings in the shape the agent kind reads: fastmcp's
    ``{"mcpServers": {name: server}}`` with the key as bearer ``auth`` for ours (and SDK 1.21);
    ``{name: server}`` with ``auth: {"strategy": "bearer", "value": key}`` for agent server 1.58
    (its ``agent.mcp_config`` is a ``dict[str, MCPServer]``). Stdio servers go by their name,
    remote ones as ``sse-<n>``/``shttp-<n>``."""
    servers: dict[str, dict[str, Any]] = {}
    for stdio in config.stdio_servers:
        servers[stdio.name] = {"command": stdio.command, "args": stdio.args, "env": stdio.env}
    remote = [("sse", s, None) for s in config.sse_servers] + [
        ("http", s, s.timeout) for s in config.shttp_servers
    ]
    for n, (transport, server, timeout) in enumerate(remote):
        name = f"{'sse' if transport == 'sse' else 'shttp'}-{n}"
        while name in servers:
            name += "_"
        entry: dict[str, Any] = {"url": server.url, "transport": transport}
        if server.api_key:
            official = agent_kind == "openhands"
            entry["auth"] = (
                {"strategy": "bearer", "value": server.api_key} if official else server.api_key
            )
        if timeout is not None:
            entry["timeout"] = timeout
        servers[name] = entry
    if not servers:
        return {}
    return servers if agent_kind == "openhands" else {"mcpServers": servers}


def start_conversation_request(
    *,
    conversation_id: str,
    llm: dict[str, Any],
    working_dir: str,
    initial_message: dict[str, Any] | None,
    max_iterations: int,
    max_budget_per_task: float | None,
    confirmation_mode: bool,
    secrets: dict[str, str],
    mcp_config: MCPConfig | None,
    system_message_suffix: str | None,
    agent_kind: AgentKind = "acs",
) -> dict[str, Any]:
    """``llm`` holds the SDK ``LLM`` fields (model, base_url, api_key, prices); unset (None)
    values are left out so the server applies its own defaults."""
    given = {k: v for k, v in llm.items() if v is not None}
    agent: dict[str, Any] = {
        "kind": "Agent",
        "llm": {"usage_id": "agent", **LLM_RETRIES, **given},
        "tools": [{"name": name} for name in AGENT_TOOLS],
    }
    if mcp_config is not None and (servers := mcp_servers(mcp_config, agent_kind)):
        agent["mcp_config"] = servers
    if system_message_suffix:
        agent["agent_context"] = {"system_message_suffix": system_message_suffix}
    body: dict[str, Any] = {
        "conversation_id": conversation_id,
        "agent": agent,
        "workspace": {"kind": "LocalWorkspace", "working_dir": working_dir},
        "confirmation_policy": {"kind": "AlwaysConfirm" if confirmation_mode else "NeverConfirm"},
        "initial_message": initial_message,
        "max_iterations": max_iterations,
        "secrets": {name: {"kind": "StaticSecret", "value": v} for name, v in secrets.items()},
        # The title is ours (the user's or "Conversation <id>"): the official server would
        # otherwise spend an LLM call of the user's on one we never show.
        "autotitle": False,
        # Ours: the official server has no budget and ignores the field.
        "max_budget_per_task": max_budget_per_task,
    }
    return {k: v for k, v in body.items() if v is not None}
