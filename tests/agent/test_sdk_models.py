"""Every event kind and the ConversationInfo our agent produces, validated by openhands-sdk 1.21's
own pydantic models in the pinned client venv (tests/clients/sdk_validate.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.agent.conv_helpers import BASE, events, info, start, user_message, wait_status
from tests.agent.test_conversation_mcp import MCP_TIMEOUT, SERVER
from tests.agent.test_conversation_secrets_webhooks import Receiver
from tests.support.fake_llm import FakeLLM, reply_text, reply_tool_call, reply_tool_calls, tool_call
from tests.support.openhands_clients import OpenHandsVenv
from tests.support.types import Client

pytestmark = [pytest.mark.slow, pytest.mark.clients]

VALIDATOR = Path(__file__).resolve().parents[1] / "clients" / "sdk_validate.py"
EXPECTED_KINDS = {
    "SystemPromptEvent",
    "MessageEvent",
    "ActionEvent:TerminalAction",
    "ActionEvent:FileEditorAction",
    "ActionEvent:ThinkAction",
    "ActionEvent:FinishAction",
    "ActionEvent:MCPToolAction",
    "ObservationEvent:TerminalObservation",
    "ObservationEvent:FileEditorObservation",
    "ObservationEvent:ThinkObservation",
    "ObservationEvent:FinishObservation",
    "ObservationEvent:MCPToolObservation",
    "UserRejectObservation",
    "AgentErrorEvent",
    "ConversationErrorEvent",
    "ConversationStateUpdateEvent:execution_status",
    "ConversationStateUpdateEvent:stats",
    "ConversationStateUpdateEvent:stop_reason",
    "ConversationStateUpdateEvent:confirmation_policy",
    "ConversationStateUpdateEvent:full_state",
    "PauseEvent",
    "LLMCompletionLogEvent",
    "ConversationInfo",
    "ConversationStats",
}


async def scripted_run(client: Client, auth: dict[str, str], fake: FakeLLM) -> str:
    """A conversation that makes the agent emit every kind of event it has."""
    fake.script(
        [
            reply_tool_calls(
                tool_call("terminal", {"command": "echo hi; echo oops >&2; exit 2"}),
                tool_call("think", {"thought": "Next, the file."}),
                tool_call("calc__add", {"a": 2, "b": 3}),
                tool_call("no_such_tool", {}),
                thought="Looking around.",
            ),
            reply_tool_call(
                "file_editor", {"command": "create", "path": "a.py", "file_text": "x\n"}
            ),
            reply_tool_call(
                "file_editor",
                {"command": "str_replace", "path": "a.py", "old_str": "y", "new_str": "z"},
            ),
            reply_text("Shall I go on?"),
            reply_tool_call("terminal", {"command": "rm -rf /tmp/nothing"}),
            reply_tool_call("finish", {"message": "Done."}),
        ]
    )
    servers = {
        "calc": {"command": sys.executable, "args": [SERVER]},
        "broken": {"command": "/nonexistent/mcp-server"},
    }
    llm = {"log_completions": True, "retry_min_wait": 1, "retry_max_wait": 1}
    cid: str = (await start(client, auth, fake, "Start.", llm=llm, mcp_servers=servers))["id"]
    done = await wait_status(client, auth, cid, timeout=MCP_TIMEOUT)
    assert done["execution_status"] == "finished"  # the text reply ended the run
    await client.post(f"{BASE}/{cid}/events", json=user_message("Wait.", run=False), headers=auth)
    await client.post(f"{BASE}/{cid}/pause", headers=auth)  # idle: paused at once, a PauseEvent
    policy = {"policy": {"kind": "AlwaysConfirm"}}
    await client.post(f"{BASE}/{cid}/confirmation_policy", json=policy, headers=auth)
    await client.post(f"{BASE}/{cid}/events", json=user_message("Go on."), headers=auth)
    assert (await wait_status(client, auth, cid))["execution_status"] == "waiting_for_confirmation"
    reject = {"accept": False, "reason": "Not that."}
    await client.post(f"{BASE}/{cid}/events/respond_to_confirmation", json=reject, headers=auth)
    assert (await wait_status(client, auth, cid))["execution_status"] == "waiting_for_confirmation"
    await client.post(
        f"{BASE}/{cid}/events/respond_to_confirmation", json={"accept": True}, headers=auth
    )
    assert (await wait_status(client, auth, cid))["execution_status"] == "finished"
    await client.post(
        f"{BASE}/{cid}/events", json=user_message("One more.", run=False), headers=auth
    )
    return cid


async def full_state(client: Client, auth: dict[str, str], cid: str) -> dict[str, Any]:
    async with client.ws_connect(f"/sockets/events/{cid}", headers=auth) as ws:
        frame: dict[str, Any] = await ws.receive_json(timeout=10)
    return frame


async def test_every_event_and_the_conversation_info_validate_with_the_sdk(
    make_agent_client: Any,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    openhands_venv: OpenHandsVenv,
    tmp_path: Path,
) -> None:
    rec = Receiver()
    hooks = web.Application()
    hooks.router.add_post("/hooks/{kind:events}/{cid}", rec.handle)
    hooks.router.add_post("/hooks/{kind:conversations}", rec.handle)
    runner = web.AppRunner(hooks, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}/hooks"
    try:
        client = await make_agent_client(webhook_base_url=base)
        cid = await scripted_run(client, auth, local_fake_llm)
        items = await events(client, auth, cid)
        await rec.wait_for(lambda: len(rec.events) == len(items))
        infos = [await info(client, auth, cid), *rec.infos]
        state = await full_state(client, auth, cid)
    finally:
        await runner.cleanup()
    assert rec.events == items  # the webhooks carry the same events
    stats = [
        e["value"]
        for e in items
        if e["kind"] == "ConversationStateUpdateEvent" and e["key"] == "stats"
    ]
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"events": [*items, state], "infos": infos, "stats": stats}))

    result = await asyncio.to_thread(
        subprocess.run,
        [str(openhands_venv.python), str(VALIDATOR), str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == []
    assert set(report["checked"]) == EXPECTED_KINDS
