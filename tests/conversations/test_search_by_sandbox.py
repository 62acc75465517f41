"""Conversation search and count with a sandbox filter read that sandbox's conversations, not
every conversation the user has (issue 30: no per-request read of everything): the user's other
records are made unreadable here, so a search that read them would fail."""

from __future__ import annotations

import secrets

import redis.asyncio as aioredis

from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.ids import uuid7_hex
from controlplane.store import keyspace
from tests.support.records import NO_ENGINE
from tests.support.types import ClientFactory, UserHeaders

BASE = "/api/v1/app-conversations"


async def test_a_sandbox_filter_reads_only_that_sandboxs_conversations(
    make_client: ClientFactory, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    alice, bob = await user_headers("alice"), await user_headers("bob")
    store = ConversationStore(raw_redis)
    shared, other = "s" + secrets.token_hex(8), "s" + secrets.token_hex(8)
    mine = []
    for _ in range(5):
        info = AppConversationInfo(id=uuid7_hex(), created_by_user_id="alice", sandbox_id=shared)
        await store.save(info)
        mine.append(info.id)
    # Bob's conversation in the same sandbox id is not alice's to see.
    await store.save(
        AppConversationInfo(id=uuid7_hex(), created_by_user_id="bob", sandbox_id=shared)
    )
    # 50 more of alice's elsewhere, their records unreadable: reading them would be a 500.
    for _ in range(50):
        info = AppConversationInfo(id=uuid7_hex(), created_by_user_id="alice", sandbox_id=other)
        await store.save(info)
        await raw_redis.set(keyspace.conversation(info.id), b"{not json")

    seen: list[str] = []
    page: str | None = None
    while True:
        params = {"sandbox_id__eq": shared, "limit": "2", **({"page_id": page} if page else {})}
        resp = await client.get(f"{BASE}/search", params=params, headers=alice)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert len(body["items"]) <= 2
        seen += [item["id"] for item in body["items"]]
        page = body["next_page_id"]
        if page is None:
            break
    assert seen == sorted(mine, reverse=True)  # newest first, each once, across pages

    params = {"sandbox_id__eq": shared, "sort_order": "CREATED_AT", "limit": "100"}
    resp = await client.get(f"{BASE}/search", params=params, headers=alice)
    assert [i["id"] for i in (await resp.json())["items"]] == sorted(mine)
    params = {"sandbox_id__eq": shared, "sort_order": "UPDATED_AT_DESC", "limit": "100"}
    resp = await client.get(f"{BASE}/search", params=params, headers=alice)
    assert resp.status == 200
    assert sorted(i["id"] for i in (await resp.json())["items"]) == sorted(mine)

    resp = await client.get(f"{BASE}/count", params={"sandbox_id__eq": shared}, headers=alice)
    assert await resp.json() == 5
    resp = await client.get(f"{BASE}/count", params={"sandbox_id__eq": shared}, headers=bob)
    assert await resp.json() == 1
    # Without the sandbox filter the records within the time bounds are read, the broken ones
    # too (the control; a count without any filter, or with one kind of time bounds, reads
    # an index alone: tests/conversations/test_search_pages.py).
    since = "2000-01-01T00:00:00Z"
    resp = await client.get(
        f"{BASE}/count",
        params={"created_at__gte": since, "updated_at__gte": since},
        headers=alice,
    )
    assert resp.status == 500
