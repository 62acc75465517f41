"""Helpers for the conversation tests: start one, wait for a status, read its events."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.fake_llm import FakeLLM
from tests.support.types import Client

BASE = "/api/conversations"
LLM_KEY = "sk-fake-llm-key-0123456789"
STOPPED = ("idle", "paused", "finished", "error", "stuck", "waiting_for_confirmation")


TOOLS = [{"name": "TerminalTool"}, {"name": "FileEditorTool"}]


def llm_config(fake: FakeLLM, **overrides: Any) -> dict[str, Any]:
    """The SDK's ``LLM`` fields pointing at ``fake``, with quick retries."""
    config: dict[str, Any] = {
        "model": "fake-model",
        "base_url": fake.base_url,
        "api_key": LLM_KEY,
        "usage_id": "agent",
        "timeout": 10,
        "num_retries": 2,
        "retry_min_wait": 0.01,
        "retry_max_wait": 0.05,
    }
    config.update(overrides)
    return config


def start_body(
    fake: FakeLLM,
    *,
    llm: dict[str, Any] | None = None,
    confirmation_mode: bool = False,
    working_dir: str | None = None,
    system_message_suffix: str | None = None,
    mcp_servers: dict[str, Any] | None = None,
    **body: Any,
) -> dict[str, Any]:
    """An SDK ``StartConversationRequest``; the keyword shortcuts fill its nested fields."""
    agent: dict[str, Any] = {"kind": "Agent", "llm": llm_config(fake, **(llm or {}))}
    agent["tools"] = TOOLS
    if system_message_suffix is not None:
        agent["agent_context"] = {"system_message_suffix": system_message_suffix}
    if mcp_servers is not None:
        agent["mcp_config"] = {"mcpServers": mcp_servers}
    payload: dict[str, Any] = {"agent": agent}
    if working_dir is not None:
        payload["workspace"] = {"kind": "LocalWorkspace", "working_dir": working_dir}
    if confirmation_mode:
        payload["confirmation_policy"] = {"kind": "AlwaysConfirm"}
    payload.update(body)
    return payload


def user_message(text: str, run: bool = True) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "run": run}


async def start(
    client: Client,
    auth: dict[str, str],
    fake: FakeLLM,
    message: str | None = "Do the task.",
    *,
    expect: int = 201,
    **body: Any,
) -> dict[str, Any]:
    """POST /api/conversations (see :func:`start_body`); returns the ConversationInfo."""
    payload = start_body(fake, **body)
    if message is not None:
        payload["initial_message"] = user_message(message)
    resp = await client.post(BASE, json=payload, headers=auth)
    assert resp.status == expect, await resp.text()
    info: dict[str, Any] = await resp.json()
    return info


async def info(client: Client, auth: dict[str, str], cid: str) -> dict[str, Any]:
    resp = await client.get(f"{BASE}/{cid}", headers=auth)
    assert resp.status == 200, await resp.text()
    data: dict[str, Any] = await resp.json()
    return data


async def wait_status(
    client: Client,
    auth: dict[str, str],
    cid: str,
    statuses: tuple[str, ...] = STOPPED,
    timeout: float = 20.0,
) -> dict[str, Any]:
    """Poll until the conversation's status is one of ``statuses``; returns the info."""
    async with asyncio.timeout(timeout):
        while True:
            data = await info(client, auth, cid)
            if data["execution_status"] in statuses:
                return data
            await asyncio.sleep(0.02)


async def events(client: Client, auth: dict[str, str], cid: str) -> list[dict[str, Any]]:
    """Every event of a conversation, through the paged search route."""
    items: list[dict[str, Any]] = []
    page_id: str | None = None
    for _ in range(1000):
        params = {"limit": "100", **({"page_id": page_id} if page_id else {})}
        resp = await client.get(f"{BASE}/{cid}/events/search", params=params, headers=auth)
        assert resp.status == 200, await resp.text()
        page = await resp.json()
        items.extend(page["items"])
        page_id = page["next_page_id"]
        if page_id is None:
            return items
    raise AssertionError("too many pages")


def of_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in items if e["kind"] == kind]


def statuses(items: list[dict[str, Any]]) -> list[str]:
    return [
        e["value"]
        for e in items
        if e["kind"] == "ConversationStateUpdateEvent" and e["key"] == "execution_status"
    ]


def stop_reasons(items: list[dict[str, Any]]) -> list[str]:
    return [
        e["value"]
        for e in items
        if e["kind"] == "ConversationStateUpdateEvent" and e["key"] == "stop_reason"
    ]
