"""The real openhands-sdk against a sandbox started through our API: RemoteConversation (create
with an SDK Agent, message, run, events over the WebSocket, finish) and RemoteWorkspace
(execute_command, file_upload, file_download), on our agent (spec `default`, SDK 1.21, the
clients' pin) and on the official agent server (spec `openhands`, SDK 1.58, its own version:
1.21 cannot read 1.58's events); and the control plane's start request read by the SDK's own
StartConversationRequest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.agent_protocol.start_request import start_conversation_request
from controlplane.settings.mcp import MCPConfig
from tests.support.conversation_helpers import LLM_KEY, UserFactory
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.live_server import Api, running_sandbox
from tests.support.openhands_clients import OpenHandsVenv, run_client_script
from tests.support.sandbox_helpers import OwnDocker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.clients,
    pytest.mark.usefixtures("sandbox_images"),
    # The disabled openhands spec offered; the official server boots in 7-12 s idle, a minute or
    # more on a busy CI host.
    pytest.mark.live_config(enable_specs=["openhands"], start_timeout=240),
]

#: (spec, the model name its agent server's LLM client needs for the fake OpenAI-style server,
#: the tool names it registers)
SPECS = [
    pytest.param("default", "fake-model", "TerminalTool,FileEditorTool", id="acs"),
    pytest.param(
        "openhands",
        "openai/fake-model",
        "terminal,file_editor",
        id="official",
        marks=[pytest.mark.official_agent, pytest.mark.timeout(900)],
    ),
]


async def agent_server(api: Api, spec: str = "default") -> tuple[str, str, str]:
    """(sandbox id, AGENT_SERVER url, session key) of a new RUNNING sandbox (the official
    server boots in 7-12 s idle, minutes on a busy CI host)."""
    body = await running_sandbox(api, spec, within=240)
    (url,) = [u["url"] for u in body["exposed_urls"] if u["name"] == "AGENT_SERVER"]
    return body["id"], url, body["session_api_key"]


async def run_sdk_remote(
    venv: OpenHandsVenv,
    api: Api,
    fake: FakeLLM,
    home: Path,
    *,
    spec: str = "default",
    model: str = "fake-model",
    tools: str = "terminal,file_editor",
) -> dict[str, Any]:
    """sdk_remote.py (RemoteConversation, RemoteWorkspace) run in `venv` against a new sandbox of
    `api`'s user on `spec`, its model `fake` (named `model`, its tools `tools`): the report."""
    _sandbox_id, url, key = await agent_server(api, spec)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "AGENT_URL": url,
        "SESSION_KEY": key,
        "LLM_BASE_URL": fake.container_base_url,
        "LLM_KEY": LLM_KEY,
        "WORK_DIR": str(home),
        "LLM_MODEL": model,
        "TOOL_NAMES": tools,
    }
    return await run_client_script(venv, "sdk_remote.py", env=env)


@pytest.mark.parametrize(("spec", "model", "tools"), SPECS)
async def test_remote_conversation_and_workspace_drive_a_sandbox(
    spec: str,
    model: str,
    tools: str,
    *,
    request: pytest.FixtureRequest,
    user: UserFactory,
    fake_llm: FakeLLM,
    openhands_venv: OpenHandsVenv,
    own_docker: OwnDocker,
    tmp_path: Path,
) -> None:
    greeting = "echo hello-from-the-sdk > /workspace/sdk.txt && cat /workspace/sdk.txt"
    fake_llm.script([reply_tool_call("terminal", {"command": greeting}), reply_finish("Greeted.")])
    venv = openhands_venv
    if spec == "openhands":
        # The image is built on first use (minutes); its SDK version reads its events.
        venv = request.getfixturevalue("official_sdk_venv")
        # SDK 1.58 asks the server for a title (an LLM call without tools), racing the run.
        fake_llm.untooled = reply_text("Greeting", usage=(0, 0))
    alice = await user("alice")
    report = await run_sdk_remote(
        venv, alice, fake_llm, tmp_path, spec=spec, model=model, tools=tools
    )

    assert report["status"] == "finished"
    kinds = report["kinds"]
    # The official server's socket may first send its state (a ConversationStateUpdateEvent).
    assert next(k for k in kinds if k != "ConversationStateUpdateEvent") == "SystemPromptEvent"
    for kind in ("MessageEvent", "ActionEvent", "ObservationEvent", "ConversationStateUpdateEvent"):
        assert kind in kinds, kinds
    # The run's events reached the SDK over the WebSocket, not only by the REST sync.
    for kind in ("ActionEvent", "ObservationEvent", "ConversationStateUpdateEvent"):
        assert kind in report["socket_kinds"], report["socket_kinds"]
    assert report["commands"] == [greeting]
    assert report["outputs"] == ["hello-from-the-sdk"]
    assert report["agent_model"] == model
    assert report["workspace"]["working_dir"] == "/workspace"
    assert report["prompt_tokens"] == 200  # two LLM calls, read from the ConversationStats
    (container,) = own_docker.containers()
    assert container.exec_run(["cat", "/workspace/sdk.txt"]).output == b"hello-from-the-sdk\n"
    assert fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"

    assert report["execute"] == {"exit_code": 3, "stdout": "from-sdk\n/tmp\n", "stderr": "oops\n"}
    assert report["upload"] == {"success": True, "size": 256 * 64}
    assert report["download"] == {"success": True, "same": True}
    assert report["missing_download_fails"] is True


async def test_the_control_plane_start_request_is_the_sdks(
    openhands_venv: OpenHandsVenv, tmp_path: Path
) -> None:
    mcp = MCPConfig.model_validate(
        {
            "stdio_servers": [
                {"name": "fs", "command": "npx", "args": ["-y", "fs"], "env": {"A": "b"}}
            ],
            "sse_servers": [{"url": "https://mcp.example.com/sse", "api_key": "k1"}],
            "shttp_servers": [
                {"url": "https://mcp.example.com/mcp", "api_key": "k2", "timeout": 30}
            ],
        }
    )
    full = start_conversation_request(
        conversation_id="0193d6e4c2b87a3f9e1d2c3b4a596877",
        llm={
            "model": "gpt-4o-mini",
            "base_url": "http://host.docker.internal:11434/v1",
            "api_key": "sk-secret",
            "input_cost_per_token": 1e-6,
            "output_cost_per_token": None,
        },
        working_dir="/workspace/repo",
        initial_message={"role": "user", "content": [{"type": "text", "text": "hi"}], "run": True},
        max_iterations=50,
        max_budget_per_task=2.5,
        confirmation_mode=True,
        secrets={"GITHUB_TOKEN": "ghp_x"},
        mcp_config=mcp,
        system_message_suffix="Be brief.",
    )
    minimal = start_conversation_request(
        conversation_id="0193d6e4c2b87a3f9e1d2c3b4a596878",
        llm={"model": "m", "base_url": None, "api_key": "k"},
        working_dir="/workspace",
        initial_message=None,
        max_iterations=100,
        max_budget_per_task=None,
        confirmation_mode=False,
        secrets={},
        mcp_config=None,
        system_message_suffix=None,
    )
    dump = tmp_path / "requests.json"
    dump.write_text(json.dumps({"events": [], "infos": [], "start_requests": [full, minimal]}))
    report = await run_client_script(openhands_venv, "sdk_validate.py", str(dump))
    assert report["failures"] == []
    assert report["checked"] == {"StartConversationRequest": 2}
