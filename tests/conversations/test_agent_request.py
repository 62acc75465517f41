"""What the control plane hands a sandbox's agent server: the SDK start request built from the
user's settings, and the container's environment (CORS origins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.agent_protocol.start_request import mcp_servers, start_conversation_request
from controlplane.config import ServiceConfig
from controlplane.sandboxes.launcher import sandbox_request
from controlplane.sandboxes.models import SandboxStatus
from controlplane.settings.mcp import MCPConfig
from controlplane.specs.catalog import SpecCatalog
from tests.conftest import REPO
from tests.support.records import sandbox_record


def request(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "conversation_id": "0193d6e4c2b87a3f9e1d2c3b4a596877",
        "llm": {"model": "m", "base_url": None, "api_key": "k", "input_cost_per_token": None},
        "working_dir": "/workspace",
        "initial_message": None,
        "max_iterations": 100,
        "max_budget_per_task": None,
        "confirmation_mode": False,
        "secrets": {},
        "mcp_config": None,
        "system_message_suffix": None,
    }
    values.update(overrides)
    return start_conversation_request(**values)


def test_the_start_request_in_the_sdks_shape() -> None:
    body = request()
    assert body == {
        "conversation_id": "0193d6e4c2b87a3f9e1d2c3b4a596877",
        "agent": {
            "kind": "Agent",
            "llm": {
                "usage_id": "agent",
                "num_retries": 3,
                "retry_min_wait": 2,
                "retry_max_wait": 30,
                "model": "m",
                "api_key": "k",
            },
            "tools": [
                {"name": "terminal"},
                {"name": "file_editor"},
                {"name": "task_tracker"},
            ],
        },
        "workspace": {"kind": "LocalWorkspace", "working_dir": "/workspace"},
        "confirmation_policy": {"kind": "NeverConfirm"},
        "max_iterations": 100,
        "secrets": {},
        "autotitle": False,
    }
    body = request(
        confirmation_mode=True,
        secrets={"GITHUB_TOKEN": "t"},
        system_message_suffix="Be brief.",
        max_budget_per_task=1.5,
        initial_message={"role": "user", "content": [{"type": "text", "text": "hi"}], "run": True},
    )
    assert body["confirmation_policy"] == {"kind": "AlwaysConfirm"}
    assert body["secrets"] == {"GITHUB_TOKEN": {"kind": "StaticSecret", "value": "t"}}
    assert body["agent"]["agent_context"] == {"system_message_suffix": "Be brief."}
    assert body["max_budget_per_task"] == 1.5
    assert body["initial_message"]["content"][0]["text"] == "hi"


def test_mcp_settings_become_mcp_servers() -> None:
    config = MCPConfig.model_validate(
        {
            "stdio_servers": [
                {"name": "sse-0", "command": "fs", "args": ["-x"], "env": {"A": "b"}}
            ],
            "sse_servers": ["https://a.example.com/sse"],
            "shttp_servers": [{"url": "https://b.example.com/mcp", "api_key": "key", "timeout": 9}],
        }
    )
    assert mcp_servers(config) == {
        "mcpServers": {
            "sse-0": {"command": "fs", "args": ["-x"], "env": {"A": "b"}},
            "sse-0_": {"url": "https://a.example.com/sse", "transport": "sse"},
            "shttp-1": {
                "url": "https://b.example.com/mcp",
                "transport": "http",
                "auth": "key",
                "timeout": 9,
            },
        }
    }
    assert mcp_servers(MCPConfig()) == {}
    assert "mcp_config" not in request(mcp_config=MCPConfig())["agent"]
    assert request(mcp_config=config)["agent"]["mcp_config"] == mcp_servers(config)


def test_sandboxes_get_the_cors_origins(make_config: Callable[..., ServiceConfig]) -> None:
    config = make_config(cors_origins="https://ui.example.com, http://localhost:3001")
    spec = SpecCatalog.load(REPO / "specs").default
    env = sandbox_request(config, sandbox_record("alice", SandboxStatus.STARTING), spec).env
    assert env["OH_ALLOW_CORS_ORIGINS_0"] == "https://ui.example.com"
    assert env["OH_ALLOW_CORS_ORIGINS_1"] == "http://localhost:3001"
    assert "OH_ALLOW_CORS_ORIGINS_2" not in env
    plain = sandbox_request(make_config(), sandbox_record("bob", SandboxStatus.STARTING), spec).env
    assert not any(k.startswith("OH_ALLOW_CORS_ORIGINS") for k in plain)
