"""openhands-sdk / openhands-workspace 1.58.2, the newest, against a live control plane
(tests/clients/requirements-sdk158.lock, its own venv):

- OpenHandsCloudWorkspace: a sandbox created, `get_llm()` (plain: the LLM gateway with the
  user's gateway key; and by profile), `get_mcp_config()`, `get_secrets()` and
  `_get_secret_value()` with OpenHands' authorisation rule, a conversation in the sandbox with
  that LLM (its model calls through the gateway) resolving those LookupSecrets, `cleanup()`;
- RemoteConversation and RemoteWorkspace of 1.58.2 on our agent server (sdk_remote.py).

The control plane listens on the sandbox network's gateway too, with its port open to
sandboxes (ACS_SANDBOX_HOST_PORTS): a LookupSecret carries the URL the SDK was given, and the
agent server in the sandbox must reach it to fetch the value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.clients.test_sdk_remote import run_sdk_remote
from tests.support.conversation_helpers import LLM_KEY, UserFactory
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.live_server import LiveServer, free_port
from tests.support.openhands_clients import OpenHandsVenv, run_client_script
from tests.support.sandbox_helpers import OwnDocker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.clients,
    pytest.mark.usefixtures("sandbox_images"),
    pytest.mark.live_config("api_port_open_to_sandboxes"),
]
SAVE_TOKEN = 'printf %s "$DEPLOY_TOKEN" > /workspace/token.txt'


@pytest.fixture
def api_port() -> int:
    return free_port()


@pytest.fixture
def api_port_open_to_sandboxes(fake_llm_port: int, api_port: int) -> dict[str, Any]:
    """The live server's settings: sandboxes may reach the API's port on their gateway too."""
    return {"sandbox_host_ports": [fake_llm_port, api_port]}


@pytest.fixture
async def cloud_url(live: LiveServer, api_port: int) -> str:
    """The API on the sandbox network's gateway: reachable from this host and from sandboxes."""
    gateway = await live.sandbox_gateway()
    site = web.TCPSite(live.runner, gateway, api_port)
    await site.start()
    return f"http://{gateway}:{api_port}"


async def test_cloud_workspace_reads_llm_mcp_and_secrets(
    sdk158_venv: OpenHandsVenv,
    *,
    user: UserFactory,
    fake_llm: FakeLLM,
    cloud_url: str,
    own_docker: OwnDocker,
    tmp_path: Path,
) -> None:
    fake_llm.script([reply_tool_call("terminal", {"command": SAVE_TOKEN}), reply_finish("saved")])
    fake_llm.untooled = reply_text("Token", usage=(0, 0))
    alice = await user("alice")
    await alice.ok(
        "POST",
        "/api/secrets",
        json={"name": "DEPLOY_TOKEN", "value": "tok-158", "description": "d"},
    )
    mcp = {"shttp_servers": [{"url": "https://mcp.example.com/mcp", "api_key": "mcp-secret"}]}
    await alice.ok("POST", "/api/add-git-providers", json={"mcp_config": mcp})
    profile = {"llm": {"model": "openai/fast-model", "base_url": "https://llm.example/v1"}}
    await alice.ok("POST", "/api/v1/settings/profiles/fast", json=profile)

    report = await run_client_script(
        sdk158_venv,
        "sdk_cloud_workspace.py",
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "CLOUD_URL": cloud_url,
            "CLOUD_KEY": alice.key,
            "PROFILE": "fast",
        },
    )
    # get_llm(): the model through the LLM gateway with the user's gateway key, never the
    # provider's (docs/llm-gateway.md).
    gateway_key = (await alice.ok("GET", "/api/keys/llm/byor"))["key"]
    assert report["llm"] == {
        "model": "litellm_proxy/fake-model",
        "base_url": f"{cloud_url}/api/v1/llm-gateway",
        "api_key": gateway_key,
    }
    assert LLM_KEY not in json.dumps(report)
    assert report["profile_llm"] == {"model": "openai/fast-model", "usage_id": "profile:fast"}
    assert report["missing_profile"] == "LLM profile 'no-such-profile' not found"
    # get_mcp_config(): the server, its credential masked (secrets never leave the server).
    (server,) = report["mcp"].values()
    assert server["url"] == "https://mcp.example.com/mcp"
    assert "mcp-secret" not in json.dumps(report)
    # get_secrets(): names and look-up URLs only; the values by the session key.
    sid = report["sandbox_id"]
    assert report["secrets"] == {
        "DEPLOY_TOKEN": {
            "url": f"{cloud_url}/api/v1/sandboxes/{sid}/settings/secrets/DEPLOY_TOKEN",
            "description": "d",
        }
    }
    assert report["secret_value"] == "tok-158"
    assert report["missing_secret"] is None
    # The agent server in the sandbox resolved the LookupSecret for the command.
    assert report["status"] == "finished"
    assert report["token_file"] == "tok-158"
    # Its model calls went through the gateway: metered for alice, and the provider got the
    # provider key from the gateway (the agent only ever held the gateway key).
    usage = await alice.ok("GET", "/api/v1/llm-gateway/usage")
    assert usage["requests"] >= len(fake_llm.requests) >= 2
    assert {r.authorization for r in fake_llm.requests} == {f"Bearer {LLM_KEY}"}
    # cleanup(): DELETE /api/v1/sandboxes/{id}?sandbox_id={id}: gone.
    assert report["cleaned"] is True
    assert (await alice.call("GET", f"/api/v1/sandboxes/{sid}"))[0] == 404
    assert own_docker.containers() == []


async def test_remote_conversation_158_on_our_agent_server(
    sdk158_venv: OpenHandsVenv, user: UserFactory, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    greeting = "echo hello-from-the-sdk > /workspace/sdk.txt && cat /workspace/sdk.txt"
    fake_llm.script([reply_tool_call("terminal", {"command": greeting}), reply_finish("Greeted.")])
    fake_llm.untooled = reply_text("Greeting", usage=(0, 0))
    alice = await user("alice")
    report = await run_sdk_remote(sdk158_venv, alice, fake_llm, tmp_path)
    assert report["status"] == "finished"
    assert report["commands"] == [greeting]
    assert report["outputs"] == ["hello-from-the-sdk"]
    for kind in ("ActionEvent", "ObservationEvent", "ConversationStateUpdateEvent"):
        assert kind in report["socket_kinds"], report["socket_kinds"]
    assert report["execute"] == {"exit_code": 3, "stdout": "from-sdk\n/tmp\n", "stderr": "oops\n"}
    assert report["download"] == {"success": True, "same": True}
