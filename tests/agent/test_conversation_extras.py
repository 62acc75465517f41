"""The routes beyond running: secrets (static and looked up), confirmation policy, security
analyzer, title and tags, ask_agent, generate_title, final response, condense, interrupt."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from agent.conversations.masking import MASK
from tests.agent.conv_helpers import (
    BASE,
    events,
    info,
    of_kind,
    start,
    statuses,
    stop_reasons,
    user_message,
    wait_status,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text, reply_tool_call
from tests.support.types import Client

LOOKED_UP = "gho_looked-up-token-77"


@pytest.fixture
async def secret_server() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A LookupSecret endpoint: GET /secret answers the token when the header is right."""
    seen: list[dict[str, str]] = []

    async def secret(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        if request.headers.get("X-Access-Token") != "jws-1":
            return web.Response(status=401)
        return web.Response(text=LOOKED_UP)

    app = web.Application()
    app.router.add_get("/secret", secret)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/secret", seen
    await runner.cleanup()


def text_of(observation: dict[str, Any]) -> str:
    return "".join(part["text"] for part in observation["content"])


async def test_secret_sources_and_updates(
    agent_client: Client,
    auth: dict[str, str],
    local_fake_llm: FakeLLM,
    secret_server: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = secret_server
    show = 'echo "static=$STATIC looked=$LOOKED later=$LATER"'
    local_fake_llm.script(
        [
            reply_tool_call("terminal", {"command": show}),
            reply_text("waiting"),
            reply_tool_call("terminal", {"command": show}),
            reply_finish(),
        ]
    )
    secrets = {
        "STATIC": {"kind": "StaticSecret", "value": "static-value-1"},
        "LOOKED": {"kind": "LookupSecret", "url": url, "headers": {"X-Access-Token": "jws-1"}},
        "BROKEN": {"kind": "LookupSecret", "url": url, "headers": {"X-Access-Token": "bad"}},
    }
    cid = (await start(agent_client, auth, local_fake_llm, secrets=secrets))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    assert len(seen) == 2  # both lookups, when the run started
    resp = await agent_client.post(
        f"{BASE}/{cid}/secrets", json={"secrets": {"LATER": "later-value-2"}}, headers=auth
    )
    assert await resp.json() == {"success": True}
    await agent_client.post(f"{BASE}/{cid}/events", json=user_message("again"), headers=auth)
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"

    items = await events(agent_client, auth, cid)
    first, second = (text_of(o["observation"]) for o in of_kind(items, "ObservationEvent")[:2])
    assert first == f"static={MASK} looked={MASK} later="
    assert second == f"static={MASK} looked={MASK} later={MASK}"
    errors = of_kind(items, "ConversationErrorEvent")
    assert [e["code"] for e in errors] == ["SecretError", "SecretError"]  # one per run
    assert "BROKEN" in errors[0]["detail"]
    dumped = json.dumps(items)
    for value in ("static-value-1", LOOKED_UP, "later-value-2", "jws-1"):
        assert value not in dumped


async def test_confirmation_policy_and_security_analyzer(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("hello"), reply_tool_call("terminal", {"command": "true"})])
    cid = (await start(agent_client, auth, local_fake_llm))["id"]
    assert (await wait_status(agent_client, auth, cid))["execution_status"] == "finished"
    resp = await agent_client.post(
        f"{BASE}/{cid}/confirmation_policy",
        json={"policy": {"kind": "AlwaysConfirm"}},
        headers=auth,
    )
    assert resp.status == 200
    resp = await agent_client.post(
        f"{BASE}/{cid}/security_analyzer",
        json={"security_analyzer": {"kind": "LLMSecurityAnalyzer"}},
        headers=auth,
    )
    assert resp.status == 200
    current = await info(agent_client, auth, cid)
    assert current["confirmation_policy"] == {"kind": "AlwaysConfirm"}
    assert current["security_analyzer"] == {"kind": "LLMSecurityAnalyzer"}
    await agent_client.post(f"{BASE}/{cid}/events", json=user_message("run it"), headers=auth)
    waiting = await wait_status(agent_client, auth, cid)
    assert waiting["execution_status"] == "waiting_for_confirmation"
    assert len(waiting["pending_action_ids"]) == 1
    items = await events(agent_client, auth, cid)
    updates = [e for e in items if e["kind"] == "ConversationStateUpdateEvent"]
    assert {"key": "confirmation_policy", "value": {"kind": "AlwaysConfirm"}}.items() <= {
        k: v for e in updates if e["key"] == "confirmation_policy" for k, v in e.items()
    }.items()
    resp = await agent_client.post(
        f"{BASE}/{cid}/confirmation_policy", json={"policy": {"kind": "Sometimes"}}, headers=auth
    )
    assert resp.status == 422


async def test_confirm_risky_without_confirming_unknown_risk_never_waits(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "true"}), reply_finish()])
    policy = {"kind": "ConfirmRisky", "threshold": "HIGH", "confirm_unknown": False}
    cid = (await start(agent_client, auth, local_fake_llm, confirmation_policy=policy))["id"]
    done = await wait_status(agent_client, auth, cid)
    assert done["execution_status"] == "finished"
    assert done["confirmation_policy"] == policy


async def test_title_tags_and_generated_title(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_finish("Everything is done.")])
    long_first_line = "Please refactor the parser module so that it streams " * 2
    cid = (
        await start(
            agent_client, auth, local_fake_llm, long_first_line + "\nmore", tags={"team": "a"}
        )
    )["id"]
    done = await wait_status(agent_client, auth, cid)
    assert done["title"] == long_first_line.strip()[:49].rstrip() + "…"  # autotitle
    assert done["tags"] == {"team": "a"}
    resp = await agent_client.post(
        f"{BASE}/{cid}/generate_title", json={"max_length": 20}, headers=auth
    )
    assert await resp.json() == {"title": "Please refactor the…"}
    resp = await agent_client.post(f"{BASE}/{cid}/generate_title", headers=auth)
    assert len((await resp.json())["title"]) == 50

    resp = await agent_client.patch(
        f"{BASE}/{cid}", json={"title": " Parser work ", "tags": {"team": "b"}}, headers=auth
    )
    assert await resp.json() == {"success": True}
    current = await info(agent_client, auth, cid)
    assert (current["title"], current["tags"]) == ("Parser work", {"team": "b"})
    for bad in ({"title": "   "}, {"title": ""}, {"title": "x" * 201}):
        resp = await agent_client.patch(f"{BASE}/{cid}", json=bad, headers=auth)
        assert resp.status == 422, bad

    resp = await agent_client.get(f"{BASE}/{cid}/agent_final_response", headers=auth)
    assert await resp.json() == {"response": "Everything is done."}
    resp = await agent_client.post(f"{BASE}/{cid}/condense", headers=auth)
    assert resp.status == 409


async def test_ask_agent_records_nothing(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_text("I am idle."), reply_text("It is about a parser.")])
    cid = (await start(agent_client, auth, local_fake_llm, "Look at the parser"))["id"]
    await wait_status(agent_client, auth, cid)
    before = await events(agent_client, auth, cid)
    resp = await agent_client.post(
        f"{BASE}/{cid}/ask_agent", json={"question": "What?"}, headers=auth
    )
    assert await resp.json() == {"response": "It is about a parser."}
    assert await events(agent_client, auth, cid) == before
    asked = local_fake_llm.requests[-1].body
    assert asked["messages"][-1] == {"role": "user", "content": "What?"}
    assert "tools" not in asked
    resp = await agent_client.post(f"{BASE}/{cid}/ask_agent", json={}, headers=auth)
    assert resp.status == 422


async def test_pause_when_idle_and_interrupt_when_running(
    agent_client: Client, auth: dict[str, str], local_fake_llm: FakeLLM
) -> None:
    local_fake_llm.script([reply_tool_call("terminal", {"command": "sleep 30"})])
    cid = (await start(agent_client, auth, local_fake_llm, None))["id"]
    assert (await info(agent_client, auth, cid))["execution_status"] == "idle"
    await agent_client.post(f"{BASE}/{cid}/pause", headers=auth)
    assert (await info(agent_client, auth, cid))["execution_status"] == "paused"  # at once

    await agent_client.post(f"{BASE}/{cid}/events", json=user_message("sleep"), headers=auth)
    async with asyncio.timeout(10):
        while not of_kind(await events(agent_client, auth, cid), "ActionEvent"):  # noqa: ASYNC110 - polling the API, no event to await
            await asyncio.sleep(0.05)
    resp = await agent_client.post(f"{BASE}/{cid}/interrupt", headers=auth)
    assert resp.status == 200
    assert (await info(agent_client, auth, cid))["execution_status"] == "paused"
    items = await events(agent_client, auth, cid)
    assert len(of_kind(items, "PauseEvent")) == 2
    assert of_kind(items, "PauseEvent")[0]["source"] == "user"
    (error,) = of_kind(items, "AgentErrorEvent")
    assert "interrupted" in error["error"]
    assert stop_reasons(items) == ["interrupted"]
    assert statuses(items) == ["paused", "running", "paused"]
