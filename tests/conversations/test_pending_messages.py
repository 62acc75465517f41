"""The web frontend's pending messages (pending-message-service/pending-message-service.api.ts
in OpenHands/OpenHands `frontend/src/api/`): queued in Redis while the conversation cannot take
them, then sent to the agent in order, exactly once, when it runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.support.conversation_helpers import (
    UserFactory,
    message,
    of_kind,
    start_and_wait,
    status_is,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM
from tests.support.live_server import Api

pytestmark = pytest.mark.usefixtures("sandbox_images")


def queued(text: str) -> dict[str, Any]:
    """PendingMessageService.queueMessage's body, as conversation-websocket-context.tsx sends it."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def user_texts(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["llm_message"]["content"][0]["text"]
        for e in of_kind(events, "MessageEvent")
        if e["source"] == "user"
    ]


async def wait_texts(api: Api, cid: str, wanted: list[str], within: float = 60) -> list[str]:
    """The conversation's user messages once every wanted one arrived (and the agent is idle)."""

    def arrived(events: list[dict[str, Any]]) -> bool:
        return all(w in user_texts(events) for w in wanted) and status_is("finished")(events)

    return user_texts(await wait_events(api, cid, arrived, within))


async def test_messages_queued_while_starting_reach_the_agent_in_order_once(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice, bob = await user("alice"), await user("bob")
    # Queued at once, while the start task waits for its sandbox: under the task's id, as the
    # frontend's /conversations/task-<id> page does.
    task = await alice.ok(
        "POST", "/api/v1/app-conversations", json={"initial_message": message("m0")}
    )
    path = f"/api/v1/conversations/task-{task['id']}/pending-messages"
    first = await alice.call("POST", path, json=queued("m1"))
    second = await alice.call("POST", path, json=queued("m2"))
    assert first[0] == 201, first
    assert first[1]["queued"] is True
    assert first[1]["position"] == 1
    assert second[1]["position"] == 2
    waiting = await alice.ok("GET", path)
    assert [m["content"][0]["text"] for m in waiting] == ["m1", "m2"]
    assert waiting[0]["id"] == first[1]["id"]
    assert waiting[0]["conversation_id"] == f"task-{task['id']}"
    # Bob can neither see nor add to alice's queue: the same 404 as an unknown task.
    unknown = "/api/v1/conversations/task-" + "0" * 32 + "/pending-messages"
    status_a, body_a = await bob.call("GET", path)
    status_u, body_u = await bob.call("GET", unknown)
    assert (status_a, status_u) == (404, 404)
    assert body_a["detail"].replace(task["id"], "<id>") == body_u["detail"].replace(
        "0" * 32, "<id>"
    )
    assert (await bob.call("POST", path, json=queued("bob")))[0] == 404

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (current,) = await alice.ok(
            "GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}"
        )
        if current["status"] in ("READY", "ERROR"):
            break
        await asyncio.sleep(0.05)
    assert current["status"] == "READY", current
    cid = current["app_conversation_id"]
    texts = await wait_texts(alice, cid, ["m1", "m2"])
    assert texts == ["m0", "m1", "m2"]
    # Nothing left; a second delivery sends nothing again; the task id now names the conversation.
    assert await alice.ok("GET", path) == []
    assert await alice.ok("POST", f"{path}/deliver") == {"delivered": 0, "pending": 0}
    await asyncio.sleep(0.5)
    assert user_texts(await wait_finished(alice, cid)) == texts


async def test_a_paused_conversation_keeps_its_queue_until_it_runs(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("start"))
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    await wait_finished(alice, cid)
    path = f"/api/v1/conversations/{cid}/pending-messages"

    # While it runs, a queued message goes straight to the agent.
    live = await alice.ok("POST", path, json=queued("now"))
    assert live["position"] == 1
    assert await alice.ok("GET", path) == []
    await wait_texts(alice, cid, ["now"])

    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
    for n in range(10):
        assert (await alice.ok("POST", path, json=queued(f"p{n}")))["position"] == n + 1
    status, body = await alice.call("POST", path, json=queued("one too many"))
    assert status == 429, body
    assert "at most 10" in body["detail"]
    assert await alice.ok("POST", f"{path}/deliver") == {"delivered": 0, "pending": 10}
    status, body = await alice.call("POST", path, json={"role": "user", "content": []})
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "content"]

    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/resume")
    deadline = time.monotonic() + 60
    while (await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}"))["status"] != "RUNNING":
        assert time.monotonic() < deadline, "the sandbox never resumed"
        await asyncio.sleep(0.1)
    # The frontend calls deliver when its socket opens again; two at once send each message once.
    results = await asyncio.gather(
        alice.ok("POST", f"{path}/deliver"), alice.ok("POST", f"{path}/deliver")
    )
    assert sum(r["delivered"] for r in results) == 10
    assert await alice.ok("GET", path) == []
    wanted = [f"p{n}" for n in range(10)]
    texts = await wait_texts(alice, cid, wanted)
    assert texts == ["start", "now", *wanted]
    # Deleting the conversation drops anything still queued with it.
    await alice.ok("DELETE", f"/api/v1/app-conversations/{cid}")
    assert (await alice.call("GET", path))[0] == 404


async def test_a_message_sent_through_the_api_follows_the_pending_ones(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("start"))
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    await wait_finished(alice, cid)
    path = f"/api/v1/conversations/{cid}/pending-messages"
    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
    await alice.ok("POST", path, json=queued("q1"))
    await alice.ok("POST", path, json=queued("q2"))

    # Sending resumes the sandbox; what was queued reaches the agent first.
    await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("direct"))
    texts = await wait_texts(alice, cid, ["q1", "q2", "direct"])
    assert texts == ["start", "q1", "q2", "direct"]
    assert await alice.ok("GET", path) == []
