"""Conversation ids in every form clients send them (32 hex digits as the control plane's API
writes them, dashed as the SDK writes them, any case), on every conversation route and the
events WebSocket; and the SDK 1.58 calls this agent server refuses, each with its reason."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.agent.conv_helpers import BASE, events, start, user_message, wait_status
from tests.support.fake_llm import FakeLLM, reply_text
from tests.support.types import Client


def forms(cid: str) -> list[str]:
    plain = uuid.UUID(cid).hex
    dashed = str(uuid.UUID(cid))
    return [plain, dashed, plain.upper(), dashed.upper()]


async def test_every_route_takes_every_form_of_an_id(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("first"), reply_text("second")])
    dashed = str(uuid.uuid4())
    info = await start(agent_client, auth, local_fake_llm, conversation_id=dashed)
    assert info["id"] == dashed
    await wait_status(agent_client, auth, dashed)
    for cid in forms(dashed):
        one = f"{BASE}/{cid}"
        for path in (one, one + "/events/search", one + "/events/count"):
            response = await agent_client.get(path, headers=auth)
            assert response.status == 200, (path, await response.text())
        batch = await agent_client.get(BASE, params={"ids": cid}, headers=auth)
        assert (await batch.json())[0]["id"] == dashed
    # The web frontend's follow-up and socket use the id as our API writes it: 32 hex digits.
    plain = uuid.UUID(dashed).hex
    sent = await agent_client.post(
        f"{BASE}/{plain}/events", json=user_message("more"), headers=auth
    )
    assert sent.status == 200, await sent.text()
    await wait_status(agent_client, auth, plain.upper())
    async with agent_client.ws_connect(
        f"/sockets/events/{plain.upper()}?resend_all=true", headers=auth
    ) as ws:
        first = await ws.receive_json(timeout=10)
        assert first["key"] == "full_state"
        assert first["value"]["id"] == dashed
    assert "second" in json.dumps(await events(agent_client, auth, plain))
    # Not an id at all: the conversation is not found, in JSON.
    response = await agent_client.get(f"{BASE}/not-a-uuid", headers=auth)
    assert response.status == 404
    assert "Conversation not found" in (await response.json())["detail"]


async def test_sdk_158_calls_refused_with_their_reason(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("hi")])
    cid = (await start(agent_client, auth, local_fake_llm))["id"]

    async def post(path: str, body: Any) -> tuple[int, Any]:
        response = await agent_client.post(path, json=body, headers=auth)
        return response.status, await response.json()

    # RemoteConversation.load_plugin / navigate_to.
    status, body = await post(f"{BASE}/{cid}/load_plugin", {"plugin_ref": "github:x/y"})
    assert (status, body) == (400, {"detail": "this agent server loads no plugins"})
    status, body = await post(f"{BASE}/{cid}/navigate", {"event_id": None})
    assert status == 400
    assert "navigate is not supported" in body["detail"]
    missing = uuid.uuid4().hex
    assert (await post(f"{BASE}/{missing}/load_plugin", {"plugin_ref": "x"}))[0] == 404
    # RemoteWorkspace.get_llm / get_mcp_config / get_secrets (X-Expose-Secrets: plaintext).
    expose = auth | {"X-Expose-Secrets": "plaintext"}
    for path in (
        "/api/settings",
        "/api/profiles",
        "/api/profiles/fast",
        "/api/settings/secrets",
        "/api/settings/secrets/GITHUB_TOKEN",
    ):
        response = await agent_client.get(path, headers=expose)
        assert response.status == 404, path
        assert "control plane" in (await response.json())["detail"]
        assert (await agent_client.get(path)).status == 401  # the session key first, as everywhere
