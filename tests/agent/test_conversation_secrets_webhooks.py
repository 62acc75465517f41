"""Secret masking in events and the ordered webhook delivery to a local receiver."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.conversations.masking import MASK, Masker
from tests.agent.conv_helpers import (
    BASE,
    LLM_KEY,
    events,
    of_kind,
    start,
    user_message,
    wait_status,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.types import Client, ClientFactory

SECRET = "ghp_Secret-Value_42"


async def test_secrets_never_appear_in_events(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM, state_dir: Path
) -> None:
    local_fake_llm.script(
        [
            reply_tool_call(
                "terminal",
                {"command": f'env; echo "key={LLM_KEY}"; echo "$GITHUB_TOKEN" >&2'},
                thought=f"I will not leak {SECRET}",
            ),
            reply_finish(f"done with {LLM_KEY}"),
        ]
    )
    cid = (
        await start(
            agent_client,
            auth,
            local_fake_llm,
            f"use {SECRET}",
            secrets={"GITHUB_TOKEN": SECRET},
        )
    )["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    items = await events(agent_client, auth, cid)
    dumped = json.dumps(items)
    for secret in (SECRET, LLM_KEY, auth["X-Session-API-Key"]):
        assert secret not in dumped
    observation = of_kind(items, "ObservationEvent")[0]["observation"]["content"][0]["text"]
    assert f"GITHUB_TOKEN={MASK}" in observation  # exported to the command, then masked
    assert f"key={MASK}" in observation
    assert of_kind(items, "MessageEvent")[0]["llm_message"]["content"][0]["text"] == f"use {MASK}"
    # The model is sent the masked output too, and the files on disk are masked.
    assert SECRET not in json.dumps(local_fake_llm.requests[1].body["messages"])
    stored = state_dir / "conversations" / uuid.UUID(cid).hex
    for name in ("events.jsonl", "history.jsonl"):
        text = (stored / name).read_text()
        assert SECRET not in text
        assert LLM_KEY not in text
    assert (stored / "meta.json").stat().st_mode & 0o077 == 0


def test_masker_longest_first_and_nested() -> None:
    masker = Masker(["abc", "abcdef", "", " tok\n"])
    assert masker.mask({"k abcdef": ["xabcx", 1, None, ("tok",)]}) == {
        f"k {MASK}": [f"x{MASK}x", 1, None, [MASK]]
    }
    assert not Masker([""])


class Receiver:
    """A control plane stand-in recording the webhook calls it accepts."""

    def __init__(self) -> None:
        self.event_batches: list[list[dict[str, Any]]] = []
        self.infos: list[dict[str, Any]] = []
        self.keys: set[str | None] = set()
        self.answers: list[int] = []  # statuses to answer next, before 200s
        self.rejected = 0
        self.changed = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.keys.add(request.headers.get("X-Session-API-Key"))
        body = await request.json()
        if self.answers:
            self.rejected += 1
            self.changed.set()
            return web.json_response({"detail": "busy"}, status=self.answers.pop(0))
        if request.match_info["kind"] == "events":
            assert request.match_info["cid"]
            self.event_batches.append(body)
        else:
            self.infos.append(body)
        self.changed.set()
        return web.json_response({"success": True})

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for batch in self.event_batches for e in batch]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
async def control_plane_hooks() -> AsyncIterator[tuple[Receiver, str]]:
    """Where the agent server's webhooks land, in place of the control plane's: the receiver
    and the base URL to configure."""
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/api/v1/webhooks/sbx1/{kind:events}/{cid}", rec.handle)
    app.router.add_post("/api/v1/webhooks/sbx1/{kind:conversations}", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield rec, f"http://127.0.0.1:{port}/api/v1/webhooks/sbx1"
    await runner.cleanup()


async def test_webhooks_deliver_every_event_in_order_with_retry(
    make_agent_client: ClientFactory,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    control_plane_hooks: tuple[Receiver, str],
) -> None:
    rec, base_url = control_plane_hooks
    rec.answers = [503]  # the first POST fails once, then is retried
    client = await make_agent_client(webhook_base_url=base_url)
    local_fake_llm.script([reply_tool_call("terminal", {"command": "echo hi"}), reply_finish()])
    cid = (await start(client, auth, local_fake_llm))["id"]
    await wait_status(client, auth, cid)
    local = await events(client, auth, cid)
    await rec.wait_for(lambda: len(rec.events) == len(local))
    assert [e["id"] for e in rec.events] == [e["id"] for e in local]
    assert rec.events == local
    assert rec.rejected == 1
    assert rec.keys == {auth["X-Session-API-Key"]}
    await rec.wait_for(lambda: rec.infos[-1]["execution_status"] == "finished")
    assert {i["id"] for i in rec.infos} == {cid}
    assert rec.infos[-1]["metrics"]["accumulated_token_usage"]["prompt_tokens"] == 200
    seen = [i["execution_status"] for i in rec.infos]
    assert seen == sorted(seen, key=["idle", "running", "finished"].index)


async def test_webhook_4xx_drops_the_batch_and_goes_on(
    make_agent_client: ClientFactory,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    control_plane_hooks: tuple[Receiver, str],
) -> None:
    rec, base_url = control_plane_hooks
    rec.answers = [400]
    client = await make_agent_client(webhook_base_url=base_url)
    cid = (await start(client, auth, local_fake_llm, None))["id"]
    await rec.wait_for(lambda: rec.rejected == 1)  # the first ConversationInfo, dropped
    resp = await client.post(f"{BASE}/{cid}/events", json=user_message("hi"), headers=auth)
    assert resp.status == 200
    await wait_status(client, auth, cid)
    local = await events(client, auth, cid)
    await rec.wait_for(lambda: len(rec.events) == len(local))
    assert rec.events == local


async def test_webhook_latency_is_immediate(
    make_agent_client: ClientFactory,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    control_plane_hooks: tuple[Receiver, str],
) -> None:
    rec, base_url = control_plane_hooks
    client = await make_agent_client(webhook_base_url=base_url)
    cid = (await start(client, auth, local_fake_llm, None))["id"]
    await rec.wait_for(lambda: len(rec.infos) == 1 and len(rec.events) == 1)
    assert rec.events[0]["kind"] == "SystemPromptEvent"
    loop = asyncio.get_running_loop()
    began = loop.time()
    resp = await client.post(
        f"{BASE}/{cid}/events", json=user_message("hi", run=False), headers=auth
    )
    assert resp.status == 200
    await rec.wait_for(lambda: len(rec.events) == 2, timeout=5)
    # Sent as it was queued, on no timer: well under 0.1 s on a quiet host. The bound only has
    # to tell that from a sender that batches on an interval; 0.5 s failed once at load ~20
    # (0.525 s), so it is 2 s.
    assert loop.time() - began < 2
    assert rec.events[1]["kind"] == "MessageEvent"
