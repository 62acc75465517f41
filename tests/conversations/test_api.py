"""Conversation API behaviour around the agent: isolation, live events, start failures,
restarts, deletes and streaming."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.conversations import routes as conversation_routes
from controlplane.conversations.models import (
    AppConversationStartRequest,
    AppConversationStartTask,
    StartTaskStatus,
)
from controlplane.conversations.store import ConversationStore
from controlplane.ids import uuid7_hex
from controlplane.store import keyspace
from tests.support.conversation_helpers import (
    UserFactory,
    message,
    of_kind,
    start_and_wait,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text
from tests.support.live_server import Api, LiveServer

pytestmark = pytest.mark.usefixtures("sandbox_images")


async def test_users_cannot_see_each_others_conversations(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish()])
    alice, bob = await user("alice"), await user("bob")
    task = await start_and_wait(alice, initial_message=message("hi"))
    cid = task["app_conversation_id"]
    await wait_finished(alice, cid)
    event_id = (await alice.ok("GET", f"/api/v1/events/search?conversation_id__eq={cid}"))["items"][
        0
    ]["id"]

    assert (await bob.call("GET", f"/api/v1/app-conversations/{cid}"))[0] == 404
    assert (await bob.call("GET", f"/api/v1/events/search?conversation_id__eq={cid}"))[0] == 404
    assert (await bob.call("GET", f"/api/v1/events/count?conversation_id__eq={cid}"))[0] == 404
    assert await bob.ok("GET", f"/api/v1/events?id={event_id}") == [None]
    assert await bob.ok("GET", f"/api/v1/app-conversations?ids={cid}") == [None]
    assert (await bob.ok("GET", "/api/v1/app-conversations/search"))["items"] == []
    assert await bob.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}") == [None]
    for path in ("events", "pause", "run"):
        status, _ = await bob.call(
            "POST", f"/api/v1/app-conversations/{cid}/{path}", json=message("x")
        )
        assert status == 404
    assert (await bob.call("DELETE", f"/api/v1/app-conversations/{cid}"))[0] == 404

    (mine,) = await alice.ok("GET", f"/api/v1/events?id={event_id}")
    assert mine["id"] == event_id
    listing = await alice.ok("GET", "/api/v1/app-conversations/search")
    assert [c["id"] for c in listing["items"]] == [cid]
    assert await alice.ok("GET", "/api/v1/app-conversations/count") == 1


async def test_live_socket_replays_then_follows(
    user: UserFactory, fake_llm: FakeLLM, live: LiveServer, http: aiohttp.ClientSession
) -> None:
    fake_llm.script([reply_text("first"), reply_text("second")])
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("one"))
    cid = task["app_conversation_id"]
    before = await wait_finished(alice, cid)  # a text reply ends a run

    url = f"{live.url}/api/v1/events/socket?conversation_id={cid}&session_api_key={alice.key}"
    async with http.ws_connect(url) as ws:
        replayed = [json.loads((await ws.receive(timeout=10)).data) for _ in before]
        assert [e["id"] for e in replayed] == [e["id"] for e in before]
        await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("two"))
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while not any("second" in json.dumps(e) for e in seen):
            assert time.monotonic() < deadline, seen
            seen.append(json.loads((await ws.receive(timeout=30)).data))
    assert of_kind(seen, "MessageEvent")[0]["source"] == "user"

    status, body = await alice.call("GET", "/api/v1/events/socket?conversation_id=" + "0" * 32)
    assert status == 400, body  # not a WebSocket handshake
    handshake = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    async with http.get(
        f"{live.url}/api/v1/events/socket?conversation_id={cid}&session_api_key=wrong",
        headers=handshake,
    ) as resp:
        assert resp.status == 401


async def test_start_failures_end_in_error_with_a_detail(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice", llm_model=None)
    task = await start_and_wait(alice, initial_message=message("hi"))
    assert task["status"] == "ERROR"
    assert "llm_model" in task["detail"]

    token = "ghp_SECRETTOKEN123"
    await alice.ok(
        "POST", "/api/add-git-providers", json={"provider_tokens": {"github": {"token": token}}}
    )
    task = await start_and_wait(
        alice, llm_model="fake-model", selected_repository="acme/widgets", git_provider="github"
    )
    assert task["status"] == "ERROR"
    assert "could not clone acme/widgets" in task["detail"]
    assert token not in json.dumps(task)
    assert task["sandbox_id"]  # it got as far as a sandbox

    status, body = await alice.call(
        "POST", "/api/v1/app-conversations", json={"sandbox_id": "0" * 22}
    )
    assert status == 404, body
    # Unknown fields are ignored as OpenHands does (item 5 of issue 9); fields we use are not.
    status, body = await alice.call(
        "POST", "/api/v1/app-conversations", json={"bogus": 1, "pr_number": "x"}
    )
    assert status == 422
    assert [item["loc"] for item in body["detail"]] == [["body", "pr_number"]]
    assert fake_llm.requests == []


async def test_an_interrupted_start_task_is_resumed_by_a_replica(
    user: UserFactory, raw_redis: aioredis.Redis
) -> None:
    """A start whose replica died (no lease) is carried on by a live replica from its last
    saved step, to READY; one another replica still runs (its lease alive) is left alone."""
    alice = await user("alice")
    store = ConversationStore(raw_redis)
    task = AppConversationStartTask(
        id=uuid7_hex(),
        created_by_user_id="alice",
        status=StartTaskStatus.WAITING_FOR_SANDBOX,
        request=AppConversationStartRequest(),
    )
    running_elsewhere = AppConversationStartTask(
        id=uuid7_hex(),
        created_by_user_id="alice",
        status=StartTaskStatus.STARTING_CONVERSATION,
        request=AppConversationStartRequest(),
    )
    # Another replica is still running this one: its lease is alive.
    assert await store.hold_lease(running_elsewhere.id, "other-replica", ttl=60)
    await store.save_task(running_elsewhere)
    # Messages the web frontend queued for each (tests/conversations/test_pending_messages.py).
    for queued_for in (task.id, running_elsewhere.id):
        await raw_redis.rpush(keyspace.pending_messages(f"task-{queued_for}"), "{}")
    await store.save_task(task)  # unleased: its replica is gone

    deadline = time.monotonic() + 90
    while True:
        (resumed,) = await alice.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task.id}")
        if resumed["status"] in ("READY", "ERROR"):
            break
        assert time.monotonic() < deadline, resumed
        await asyncio.sleep(0.1)
    assert resumed["status"] == "READY", resumed
    assert resumed["app_conversation_id"] == task.id  # the task's id: a resume finds it again
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{task.id}")
    assert conversation["sandbox_id"] == resumed["sandbox_id"]
    alive = await store.get_task(running_elsewhere.id)
    assert alive is not None
    assert alive.status == StartTaskStatus.STARTING_CONVERSATION
    assert await store.active_task_ids() == [running_elsewhere.id]
    # The resumed task's queue joined its conversation; the live one's stays.
    assert not await raw_redis.exists(keyspace.pending_messages(f"task-{task.id}"))
    alive_queue = keyspace.pending_messages(f"task-{running_elsewhere.id}")
    assert await raw_redis.llen(alive_queue) == 1


async def test_delete_keeps_a_shared_sandbox(
    user: UserFactory, fake_llm: FakeLLM, live: LiveServer
) -> None:
    fake_llm.when_exhausted = reply_finish()
    alice = await user("alice")
    first = await start_and_wait(alice, initial_message=message("a"))
    second = await start_and_wait(
        alice, sandbox_id=first["sandbox_id"], initial_message=message("b")
    )
    assert second["status"] == "READY"
    assert second["sandbox_id"] == first["sandbox_id"]
    sandbox = first["sandbox_id"]

    await alice.ok("DELETE", f"/api/v1/app-conversations/{first['app_conversation_id']}")
    assert (await alice.call("GET", f"/api/v1/app-conversations/{first['app_conversation_id']}"))[
        0
    ] == 404
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{sandbox}"))["status"] == "RUNNING"
    assert (
        await alice.ok(
            "GET", f"/api/v1/events/count?conversation_id__eq={second['app_conversation_id']}"
        )
        > 0
    )

    await alice.ok("DELETE", f"/api/v1/app-conversations/{second['app_conversation_id']}")
    assert (await alice.call("GET", f"/api/v1/sandboxes/{sandbox}"))[0] == 404
    events = live.app[keys.EVENTS]
    assert await events.store.count(second["app_conversation_id"]) == 0


async def stream_start(
    http: aiohttp.ClientSession, live: LiveServer, user: Api, within: float
) -> list[dict[str, Any]]:
    """A stream-start with a first message; the snapshots once the stream has ended."""
    async with http.post(
        f"{live.url}/api/v1/app-conversations/stream-start",
        json={"initial_message": message("hi")},
        headers=user.headers,
    ) as resp:
        assert resp.status == 200
        snapshots: list[dict[str, Any]] = json.loads(await asyncio.wait_for(resp.text(), within))
    return snapshots


async def test_stream_start_streams_every_status(
    user: UserFactory, fake_llm: FakeLLM, live: LiveServer, http: aiohttp.ClientSession
) -> None:
    fake_llm.script([reply_finish()])
    alice = await user("alice")
    snapshots = await stream_start(http, live, alice, within=90)
    statuses = [s["status"] for s in snapshots]
    assert statuses[0] == "WORKING"
    assert statuses[-1] == "READY"
    assert "WAITING_FOR_SANDBOX" in statuses
    assert "STARTING_CONVERSATION" in statuses
    assert len({s["id"] for s in snapshots}) == 1


async def test_a_stream_ends_with_its_stored_task_when_an_update_never_reaches_it(
    user: UserFactory,
    live: LiveServer,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream's queue is this process's view of the task; if the end never reaches it, the
    stored task decides, so a stream never outlives its task."""
    runner = live.app[keys.CONVERSATIONS].runner
    spawn = runner.spawn

    def spawn_unheard(task: Any, principal: Any) -> asyncio.Queue[Any]:
        spawn(task, principal)  # the task runs and is stored as it goes...
        return asyncio.Queue()  # ...but the stream hears nothing of it

    monkeypatch.setattr(runner, "spawn", spawn_unheard)
    monkeypatch.setattr(conversation_routes, "STREAM_RECHECK_S", 0.2)
    alice = await user("alice", llm_model=None)  # the task fails at once: no model
    snapshots = await stream_start(http, live, alice, within=30)
    assert [s["status"] for s in snapshots] == ["WORKING", "ERROR"]
    assert "llm_model" in snapshots[-1]["detail"]
