"""WS /sockets/events/{conversation_id}: auth, replay, live events, messages, slow readers."""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from agent.conversations import events as ev
from agent.conversations import sockets
from agent.conversations.mount import CONVERSATIONS
from tests.agent.conv_helpers import events, start, wait_status
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.types import Client

SOCKET = "/sockets/events/{}"


async def frames_until(ws: Any, done: Any, timeout: float = 20) -> list[dict[str, Any]]:
    """Read frames until ``done(frames)``; fails on close or timeout."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while not done(frames):
            message = await ws.receive()
            assert message.type == WSMsgType.TEXT, message
            frames.append(json.loads(message.data))
    return frames


def status_is(value: str) -> Any:
    return lambda frames: any(
        f["kind"] == "ConversationStateUpdateEvent"
        and f["key"] == "execution_status"
        and f["value"] == value
        for f in frames
    )


async def closed_with(ws: Any) -> tuple[int | None, str]:
    message = await ws.receive(timeout=15)
    assert message.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING), message
    return ws.close_code, str(message.extra or "")


async def test_auth_by_query_header_or_first_frame(
    agent_client: Client, auth: dict[str, str], api_keys: tuple[str, ...], local_fake_llm: FakeLLM
) -> None:
    cid = (await start(agent_client, auth, local_fake_llm, None))["id"]
    url = SOCKET.format(cid)
    ways: list[tuple[dict[str, Any], dict[str, str] | None]] = [
        ({"params": {"session_api_key": api_keys[1]}}, None),
        ({"headers": auth}, None),
        ({}, {"type": "auth", "session_api_key": api_keys[0]}),
    ]
    for kwargs, first in ways:
        async with agent_client.ws_connect(url, **kwargs) as ws:
            if first is not None:
                await ws.send_json(first)
            (state,) = await frames_until(ws, lambda f: len(f) == 1)
            assert state["kind"] == "ConversationStateUpdateEvent"
            assert state["key"] == "full_state"
            assert state["value"]["id"] == cid
            assert state["value"]["execution_status"] == "idle"

    refused: list[tuple[dict[str, Any], dict[str, str] | None]] = [
        ({"params": {"session_api_key": "wrong"}}, None),
        ({"headers": {"X-Session-API-Key": "wrong"}}, None),
        ({}, {"type": "auth", "session_api_key": "wrong"}),
        ({}, {"role": "user", "content": "no auth frame"}),
    ]
    for kwargs, first in refused:
        async with agent_client.ws_connect(url, **kwargs) as ws:
            if first is not None:
                await ws.send_json(first)
            assert (await closed_with(ws))[0] == 4001

    async with agent_client.ws_connect(SOCKET.format("f" * 32), headers=auth) as ws:
        assert (await closed_with(ws)) == (4004, "Conversation not found")
    async with agent_client.ws_connect(SOCKET.format("not-an-id"), headers=auth) as ws:
        assert (await closed_with(ws))[0] == 4004


async def test_first_frame_auth_times_out(
    agent_client: Client,
    local_fake_llm: FakeLLM,
    auth: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sockets, "AUTH_TIMEOUT", 0.2)
    cid = (await start(agent_client, auth, local_fake_llm, None))["id"]
    async with agent_client.ws_connect(SOCKET.format(cid)) as ws:
        assert (await closed_with(ws))[0] == 4001


async def test_replay_then_live_events_and_a_message_on_the_socket(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("Which file?"), reply_finish("ok")])
    cid = (await start(agent_client, auth, local_fake_llm, "Edit the file"))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    stored = await events(agent_client, auth, cid)

    params = {"resend_all": "true"}
    async with agent_client.ws_connect(SOCKET.format(cid), params=params, headers=auth) as ws:
        frames = await frames_until(ws, lambda f: len(f) == len(stored) + 1)
        assert frames[0]["key"] == "full_state"
        assert frames[1:] == stored  # everything, in order, once

        # A frame from the client is a user message that continues the run (as the frontend
        # sends it: no `run`).
        await ws.send_json({"role": "user", "content": [{"type": "text", "text": "a.txt"}]})
        live = await frames_until(ws, status_is("finished"))
    everything = await events(agent_client, auth, cid)
    assert live == everything[len(stored) :]  # no gap, no duplicate
    assert (live[0]["key"], live[0]["value"]) == ("execution_status", "idle")  # a new message
    assert live[1]["kind"] == "MessageEvent"
    assert live[1]["llm_message"]["content"][0]["text"] == "a.txt"

    # Without resend: nothing old; resend_mode=since: from that time on.
    async with agent_client.ws_connect(SOCKET.format(cid), headers=auth) as ws:
        await frames_until(ws, lambda f: len(f) == 1)
        with pytest.raises(TimeoutError):
            await ws.receive(timeout=0.3)
    since = {"resend_mode": "since", "after_timestamp": everything[len(stored)]["timestamp"]}
    async with agent_client.ws_connect(SOCKET.format(cid), params=since, headers=auth) as ws:
        frames = await frames_until(ws, lambda f: len(f) == 1 + len(live))
        assert frames[1:] == live
    since["after_timestamp"] = everything[len(stored)]["timestamp"] + "+02:00"  # aware: converted
    async with agent_client.ws_connect(SOCKET.format(cid), params=since, headers=auth) as ws:
        frames = await frames_until(ws, lambda f: len(f) == 1 + len(everything))
    async with agent_client.ws_connect(
        SOCKET.format(cid), params={"resend_mode": "all"}, headers=auth
    ) as ws:
        frames = await frames_until(ws, lambda f: len(f) == 1 + len(everything))
        assert frames[1:] == everything
        await ws.send_str("not json")
        (error,) = await frames_until(ws, lambda f: len(f) == 1)
        assert error["kind"] == "ServerErrorEvent"
        await ws.send_json({"role": "robot", "content": "x"})
        (error,) = await frames_until(ws, lambda f: len(f) == 1)
        assert error["code"] == "ValidationError"


async def test_delete_closes_the_sockets(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    cid = (await start(agent_client, auth, local_fake_llm, None))["id"]
    async with agent_client.ws_connect(SOCKET.format(cid), headers=auth) as ws:
        await frames_until(ws, lambda f: len(f) == 1)
        resp = await agent_client.delete(f"/api/conversations/{cid}", headers=auth)
        assert resp.status == 200
        assert (await closed_with(ws))[0] == 4004


async def test_a_slow_reader_is_dropped_and_the_server_goes_on(
    agent_client: Client,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Short, but not so short that the fast reader misses it: server and reader share this
    # test's event loop, and deflating 30 MB on a loaded CI host stalls it (seen at 0.5 s).
    monkeypatch.setattr(sockets, "SEND_TIMEOUT", 3)
    local_fake_llm.script([reply_tool_call("terminal", {"command": "echo fine"}), reply_finish()])
    cid = (await start(agent_client, auth, local_fake_llm, None))["id"]
    conv = agent_client.app[CONVERSATIONS].service.get(cid.replace("-", ""))
    slow = await agent_client.ws_connect(SOCKET.format(cid), headers=auth)  # never reads
    async with agent_client.ws_connect(SOCKET.format(cid), headers=auth) as fast:
        await frames_until(fast, lambda f: len(f) == 1)
        big = secrets.token_urlsafe(150_000)  # incompressible: the socket is deflated
        for _ in range(150):  # 30 MB: more than the socket buffers hold
            conv.emit(ev.conversation_error_event("Noise", big))
            await asyncio.sleep(0)
        # The slow socket is dropped while the fast one keeps up.
        received = 0
        async with asyncio.timeout(90):
            while received < 150:
                message = await fast.receive()
                assert message.type == WSMsgType.TEXT
                received += 1
            while len(conv.listeners) > 1:  # noqa: ASYNC110 - the server's side of it
                await asyncio.sleep(0.05)
        # The server still serves: a run over the API, events on the fast socket.
        resp = await agent_client.post(
            f"/api/conversations/{cid}/events",
            json={"role": "user", "content": "go", "run": True},
            headers=auth,
        )
        assert resp.status == 200
        await frames_until(fast, status_is("finished"))
    await slow.close()


async def test_too_many_sockets_for_one_conversation(
    agent_client: Client,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sockets, "MAX_SOCKETS_PER_CONVERSATION", 2)
    cid = (await start(agent_client, auth, local_fake_llm, None))["id"]
    opened = [await agent_client.ws_connect(SOCKET.format(cid), headers=auth) for _ in range(2)]
    for ws in opened:
        await frames_until(ws, lambda f: len(f) == 1)
    async with agent_client.ws_connect(SOCKET.format(cid), headers=auth) as third:
        assert (await closed_with(third))[0] == 1013
    for ws in opened:
        await ws.close()


async def test_shutdown_closes_sockets(
    make_agent_client: Any, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    client = await make_agent_client()
    cid = (await start(client, auth, local_fake_llm, None))["id"]
    ws = await client.ws_connect(SOCKET.format(cid), headers=auth)
    await frames_until(ws, lambda f: len(f) == 1)
    app: web.Application = client.app
    await asyncio.wait_for(app.shutdown(), 5)
    assert (await closed_with(ws))[0] == 1001
