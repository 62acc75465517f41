"""Run in the OpenHands client venv: drive a sandbox's agent server with the real SDK.

    python sdk_remote.py   (settings in the environment, see below)  ->  one JSON line

A ``RemoteConversation`` (through ``Conversation(agent, workspace=RemoteWorkspace)``, as SDK
users write it) is created with an SDK ``Agent``, sent a message and run to the end, its events
arriving over the WebSocket; then ``RemoteWorkspace.execute_command``, ``file_upload`` and
``file_download``. Environment: ``AGENT_URL``, ``SESSION_KEY``, ``LLM_BASE_URL``, ``LLM_KEY``,
``WORK_DIR`` (a local scratch directory), ``LLM_MODEL`` (default ``fake-model``), ``TOOL_NAMES``
(default the SDK's class names; agent server 1.58 registers them as ``terminal,file_editor``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from openhands.sdk import LLM, Agent, Conversation, Event
from openhands.sdk.conversation.conversation_stats import ConversationStats
from openhands.sdk.event import ActionEvent, ObservationEvent
from openhands.sdk.tool import Tool
from openhands.sdk.workspace import RemoteWorkspace
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalAction, TerminalObservation, TerminalTool
from pydantic import SecretStr
from sdk_report import report

TOOLS = (TerminalTool, FileEditorTool)  # imported: their events can be read back


def main() -> dict[str, Any]:
    env = os.environ
    work = Path(env["WORK_DIR"])
    default_names = f"{TerminalTool.__name__},{FileEditorTool.__name__}"
    tool_names = env.get("TOOL_NAMES", default_names).split(",")
    workspace = RemoteWorkspace(
        host=env["AGENT_URL"], api_key=env["SESSION_KEY"], working_dir="/workspace"
    )
    agent = Agent(
        llm=LLM(
            model=env.get("LLM_MODEL", "fake-model"),
            base_url=env["LLM_BASE_URL"],
            api_key=SecretStr(env["LLM_KEY"]),
            usage_id="agent",
            num_retries=1,
            retry_min_wait=1,
            retry_max_wait=1,
        ),
        tools=[Tool(name=name) for name in tool_names],
    )
    received: list[Event] = []
    lock = threading.Lock()

    def on_event(event: Event) -> None:  # called from the WebSocket thread
        with lock:
            received.append(event)

    conversation = Conversation(
        agent=agent, workspace=workspace, callbacks=[on_event], visualizer=None
    )
    conversation.send_message("Write a greeting to sdk.txt and show it.")
    conversation.run(timeout=120)
    state = conversation.state
    events = list(state.events)
    outputs = [
        e.observation.text
        for e in events
        if isinstance(e, ObservationEvent) and isinstance(e.observation, TerminalObservation)
    ]
    commands = [
        e.action.command
        for e in events
        if isinstance(e, ActionEvent) and isinstance(e.action, TerminalAction)
    ]
    stats: ConversationStats = conversation.conversation_stats
    with lock:
        over_socket = [type(e).__name__ for e in received]
    result: dict[str, Any] = {
        "id": str(conversation.id),
        "status": state.execution_status.value,
        "kinds": [type(e).__name__ for e in events],
        "socket_kinds": over_socket,
        "commands": commands,
        "outputs": outputs,
        "agent_model": state.agent.llm.model,
        "workspace": state.workspace,
        "cost": stats.get_combined_metrics().accumulated_cost,
        "prompt_tokens": stats.get_combined_metrics().accumulated_token_usage.prompt_tokens,
    }

    command = workspace.execute_command("echo from-sdk; echo oops >&2; pwd; exit 3", cwd="/tmp")
    result["execute"] = {
        "exit_code": command.exit_code,
        "stdout": command.stdout,
        "stderr": command.stderr,
    }
    source = work / "upload.bin"
    source.write_bytes(bytes(range(256)) * 64)
    uploaded = workspace.file_upload(str(source), "/workspace/in/upload.bin")
    target = work / "download.bin"
    downloaded = workspace.file_download("/workspace/in/upload.bin", str(target))
    result["upload"] = {"success": uploaded.success, "size": uploaded.file_size}
    result["download"] = {
        "success": downloaded.success,
        "same": target.read_bytes() == source.read_bytes(),
    }
    missing = workspace.file_download("/workspace/nope.txt", str(work / "nope"))
    result["missing_download_fails"] = not missing.success
    conversation.close()
    return result


if __name__ == "__main__":
    report(main)
