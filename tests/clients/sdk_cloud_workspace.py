"""Run in the SDK 1.58 venv: OpenHandsCloudWorkspace against the control plane, as SDK users
write it (openhands-workspace 1.58.2).

    python sdk_cloud_workspace.py   (settings in the environment)  ->  one JSON line

Creates a sandbox (POST /api/v1/sandboxes, …), reads the user's LLM (`get_llm()`, also by
profile), MCP servers (`get_mcp_config()`) and secrets (`get_secrets()`, `_get_secret_value`),
runs a conversation in the sandbox with the LLM `get_llm()` gave (the control plane's LLM
gateway and the user's gateway key: docs/llm-gateway.md) whose secrets are those LookupSecrets
(the agent server fetches each value from the control plane), then `cleanup()` deletes the
sandbox. Environment: ``CLOUD_URL``, ``CLOUD_KEY``, ``PROFILE`` (an LLM profile the user has).
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from openhands.sdk import Agent, Conversation
from openhands.sdk.tool import Tool
from openhands.tools.terminal import TerminalTool
from openhands.workspace import OpenHandsCloudWorkspace
from sdk_report import report

TOOLS = (TerminalTool,)  # imported: its events can be read back


def main() -> dict[str, Any]:
    env = os.environ
    workspace = OpenHandsCloudWorkspace(
        cloud_api_url=env["CLOUD_URL"], cloud_api_key=env["CLOUD_KEY"]
    )
    report: dict[str, Any] = {"sandbox_id": workspace._sandbox_id}
    llm = workspace.get_llm()
    report["llm"] = {
        "model": llm.model,
        "base_url": llm.base_url,
        "api_key": llm.api_key.get_secret_value() if llm.api_key is not None else None,
    }
    profile = workspace.get_llm(profile_name=env["PROFILE"])
    report["profile_llm"] = {"model": profile.model, "usage_id": profile.usage_id}
    try:
        workspace.get_llm(profile_name="no-such-profile")
        report["missing_profile"] = "found"
    except FileNotFoundError as exc:
        report["missing_profile"] = str(exc)
    report["mcp"] = {
        name: server.model_dump(mode="json", exclude_none=True)
        for name, server in workspace.get_mcp_config().items()
    }
    secrets = workspace.get_secrets()
    report["secrets"] = {
        name: {"url": s.url, "description": s.description} for name, s in secrets.items()
    }
    report["secret_value"] = workspace._get_secret_value("DEPLOY_TOKEN")
    report["missing_secret"] = workspace._get_secret_value("NOPE")

    agent = Agent(
        llm=workspace.get_llm(num_retries=1, retry_min_wait=1, retry_max_wait=1),
        tools=[Tool(name="terminal")],
    )
    conversation = Conversation(agent=agent, workspace=workspace, visualizer=None)
    conversation.update_secrets(secrets)
    conversation.send_message("Save the deploy token.")
    conversation.run(timeout=120)
    report["status"] = conversation.state.execution_status.value
    result = workspace.execute_command("cat /workspace/token.txt")
    report["token_file"] = result.stdout
    conversation.close()
    workspace.cleanup()
    report["cleaned"] = workspace._sandbox_id is None
    return report


if __name__ == "__main__":
    report(main)
