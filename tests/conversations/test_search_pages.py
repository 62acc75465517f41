"""Conversation pages read about a page of records, whatever the user's number of conversations
(issue 30: no per-request read of everything): the updated-at orders page the user's index by
update, the title orders the user's index by title, the V0 list pages by id, an unfiltered count
is the index's size. The records a page does
not need are made unreadable here, so a request that read them would fail with a 500."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.conversations.models import (
    AppConversationInfo,
    AppConversationStartRequest,
    AppConversationStartTask,
    StartTaskStatus,
)
from controlplane.conversations.store import (
    ConversationStore,
    title_member,
    update_score,
)
from controlplane.ids import uuid7_hex
from controlplane.store import keyspace
from tests.support.records import NO_ENGINE
from tests.support.types import Client, ClientFactory, UserHeaders

BASE = "/api/v1/app-conversations"
START = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
async def pages_client(make_client: ClientFactory) -> Client:
    """An app serving conversations; its Docker engine an address nothing answers (the reads
    under test never reach a sandbox)."""
    return await make_client(with_sandboxes=True, docker_url=NO_ENGINE)


@pytest.fixture
def pages_store(raw_redis: aioredis.Redis) -> ConversationStore:
    return ConversationStore(raw_redis)


async def seed(store: ConversationStore, user: str, n: int) -> list[AppConversationInfo]:
    """`n` conversations of `user` in one sandbox, updated in an order unlike their creation's,
    with every fourth one updated at the same instant as the one before (ties, broken by id)."""
    sandbox = "s" + secrets.token_hex(8)
    infos: list[AppConversationInfo] = []
    for i in range(n):
        at = START + timedelta(seconds=(i * 37) % n, microseconds=(i * 7919) % 1000)
        if i % 4 == 3:
            at = infos[-1].updated_at
        info = AppConversationInfo(
            id=uuid7_hex(), created_by_user_id=user, sandbox_id=sandbox, updated_at=at
        )
        await store.save(info)
        infos.append(info)
    return infos


async def pages(client: Client, headers: dict[str, str], path: str, **params: str) -> list[str]:
    """Every id across the pages of `path`, in order (V1 `items` or V0 `results`)."""
    seen: list[str] = []
    page: str | None = None
    while True:
        query = params | ({"page_id": page} if page else {})
        resp = await client.get(path, params=query, headers=headers)
        assert resp.status == 200, await resp.text()
        body: Any = await resp.json()
        items = body.get("items", body.get("results"))
        assert len(items) <= int(params["limit"])
        seen += [item.get("id") or item["conversation_id"] for item in items]
        page = body["next_page_id"]
        if page is None:
            return seen


async def assert_orders(
    client: Client, headers: dict[str, str], expected: dict[str, list[str]]
) -> None:
    """Each sort order's pages, at limits 1, 7 and 100, list exactly the expected ids in order."""
    for order, ids in expected.items():
        for limit in ("1", "7", "100"):
            seen = await pages(client, headers, f"{BASE}/search", sort_order=order, limit=limit)
            assert seen == ids, (order, limit)


def by_update(infos: list[AppConversationInfo], *, desc: bool) -> list[str]:
    ordered = sorted(infos, key=lambda i: (i.updated_at, i.id), reverse=desc)
    return [i.id for i in ordered]


async def spoil_all_but(
    redis: aioredis.Redis, infos: list[AppConversationInfo], keep: set[str]
) -> None:
    for info in infos:
        if info.id not in keep:
            await redis.set(keyspace.conversation(info.id), b"{not json")


async def test_updated_at_orders_page_by_the_index_each_id_once_in_order(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    client, store = pages_client, pages_store
    alice = await user_headers("alice")
    infos = await seed(store, "alice", 60)
    await store.save(  # another user's: never in alice's pages
        AppConversationInfo(id=uuid7_hex(), created_by_user_id="bob", sandbox_id="s-bob")
    )
    await store.reindex_statuses()  # as a replica's start does: the index is known built
    await assert_orders(
        client,
        alice,
        {
            "UPDATED_AT_DESC": by_update(infos, desc=True),
            "UPDATED_AT": by_update(infos, desc=False),
        },
    )

    # A rename moves a conversation to the front of the newest-first order.
    moved = by_update(infos, desc=False)[0]
    resp = await client.patch(f"{BASE}/{moved}", json={"title": "renamed"}, headers=alice)
    assert resp.status == 200, await resp.text()
    first = await client.get(
        f"{BASE}/search", params={"sort_order": "UPDATED_AT_DESC", "limit": "1"}, headers=alice
    )
    assert [i["id"] for i in (await first.json())["items"]] == [moved]

    # A deleted conversation leaves the index with its record.
    resp = await client.delete(f"{BASE}/{moved}", headers=alice)
    assert resp.status == 200, await resp.text()
    assert await raw_redis.zscore(keyspace.user_conversations_by_update("alice"), moved) is None


async def test_a_page_reads_about_a_page_of_records(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    client, store = pages_client, pages_store
    alice = await user_headers("alice")
    infos = await seed(store, "alice", 80)
    await store.reindex_statuses()
    newest = by_update(infos, desc=True)
    # Updated-at order: the first page needs the first 3 records and reads at most one more.
    await spoil_all_but(raw_redis, infos, set(newest[:4]))
    params = {"sort_order": "UPDATED_AT_DESC", "limit": "3"}
    resp = await client.get(f"{BASE}/search", params=params, headers=alice)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert [i["id"] for i in body["items"]] == newest[:3]
    third = next(i for i in infos if i.id == newest[2])
    assert body["next_page_id"] == f"{update_score(third.updated_at)}-{third.id}"

    # The V0 list (newest created first) and the unfiltered count read no more either.
    for info in infos:
        await store.save(info)  # readable again
    created = sorted((i.id for i in infos), reverse=True)
    await spoil_all_but(raw_redis, infos, set(created[:6]))
    resp = await client.get("/api/conversations", params={"limit": "5"}, headers=alice)
    assert resp.status == 200, await resp.text()
    assert [c["conversation_id"] for c in (await resp.json())["results"]] == created[:5]
    resp = await client.get(f"{BASE}/count", headers=alice)
    assert resp.status == 200, await resp.text()
    assert await resp.json() == 80
    # A count within updated-at bounds reads no record either: the index by update's ZCOUNT,
    # each bound as the records' filter takes it (from inclusive, to exclusive).
    ordered = sorted(infos, key=lambda i: (i.updated_at, i.id))
    low, high = ordered[10].updated_at, ordered[50].updated_at
    for params, expected in (
        ({"updated_at__gte": low.isoformat()}, [i for i in infos if i.updated_at >= low]),
        ({"updated_at__lt": high.isoformat()}, [i for i in infos if i.updated_at < high]),
        (
            {"updated_at__gte": low.isoformat(), "updated_at__lt": high.isoformat()},
            [i for i in infos if low <= i.updated_at < high],
        ),
    ):
        resp = await client.get(f"{BASE}/count", params=params, headers=alice)
        assert resp.status == 200, await resp.text()
        assert await resp.json() == len(expected), params
        assert 0 < len(expected) < 80
    # A title filter reads the records its index by title says may match: none here (no
    # title holds an "x"), so it meets no unreadable one.
    resp = await client.get(f"{BASE}/count", params={"title__contains": "x"}, headers=alice)
    assert resp.status == 200, await resp.text()
    assert await resp.json() == 0
    # A created-at filter alone reads no record either: the index by creation's ZCOUNT.
    resp = await client.get(
        f"{BASE}/count", params={"created_at__gte": START.isoformat()}, headers=alice
    )
    assert resp.status == 200, await resp.text()
    assert await resp.json() == 80
    # Created-at and updated-at bounds together read the records of the narrower range (the
    # control): here it meets the unreadable ones.
    resp = await client.get(
        f"{BASE}/count",
        params={"created_at__gte": START.isoformat(), "updated_at__gte": low.isoformat()},
        headers=alice,
    )
    assert resp.status == 500


async def test_the_v0_list_pages_by_id_with_its_filters(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    client, store = pages_client, pages_store
    alice = await user_headers("alice")
    infos = await seed(store, "alice", 30)
    for info in infos[::3]:
        info.selected_repository = "acme/app"
        await store.save(info)
    everything = await pages(client, alice, "/api/conversations", limit="4")
    assert everything == sorted((i.id for i in infos), reverse=True)
    in_repo = await pages(
        client, alice, "/api/conversations", limit="4", selected_repository="acme/app"
    )
    assert in_repo == sorted((i.id for i in infos[::3]), reverse=True)
    resp = await client.get("/api/conversations", params={"page_id": "12"}, headers=alice)
    assert resp.status == 422  # an offset is no cursor of this list


async def test_an_index_out_of_step_is_put_right_by_the_next_updated_search(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    """A rolling upgrade: replicas of a version without the index by update create and delete
    conversations meanwhile (their record and the user's index only). The next updated-at search
    finds the two indexes' sizes apart and rebuilds the user's index before its page."""
    client, store = pages_client, pages_store
    carol = await user_headers("carol")
    infos = await seed(store, "carol", 12)
    index = keyspace.user_conversations_by_update("carol")
    # An older replica's create: the record and the user's index, not the index by update.
    old = AppConversationInfo(
        id=uuid7_hex(), created_by_user_id="carol", sandbox_id="s-old", updated_at=START
    )
    await raw_redis.set(keyspace.conversation(old.id), old.model_dump_json())
    await raw_redis.zadd(keyspace.user_conversations("carol"), {old.id: 0})
    seen = await pages(client, carol, f"{BASE}/search", sort_order="UPDATED_AT", limit="5")
    assert seen == by_update([*infos, old], desc=False)
    # An older replica's delete: the record and the user's index, the index by update left.
    gone = infos.pop(4)
    await raw_redis.delete(keyspace.conversation(gone.id))
    await raw_redis.zrem(keyspace.user_conversations("carol"), gone.id)
    seen = await pages(client, carol, f"{BASE}/search", sort_order="UPDATED_AT_DESC", limit="5")
    assert seen == by_update([*infos, old], desc=True)
    assert await raw_redis.zscore(index, gone.id) is None


async def test_a_start_walk_puts_records_in_the_index_and_never_undoes_a_newer_write(
    pages_store: ConversationStore, raw_redis: aioredis.Redis
) -> None:
    store = pages_store
    infos = await seed(store, "dan", 6)
    index = keyspace.user_conversations_by_update("dan")
    await raw_redis.delete(index)  # records of a version without the index
    await raw_redis.zadd(index, {infos[0].id: 1})  # a score the record does not say
    await store.reindex_statuses()
    rows = await store.page_by_update("dan", None, 100, desc=True)
    assert [i for i, _ in rows] == by_update(infos, desc=True)
    assert dict(rows)[infos[0].id] == update_score(infos[0].updated_at)
    # A read older than the record (it was written since): the walk's script leaves it alone.
    await store._index_by_update(args=[infos[1].id, "dan", 7, "2001-01-01T00:00:00Z"])
    assert await raw_redis.zscore(index, infos[1].id) == update_score(infos[1].updated_at)


async def test_a_filter_few_records_match_reads_in_growing_batches(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    """No page is one round trip per `limit + 1` records when the filter matches nothing: after
    its first read the batch doubles, up to 500 (a title query of two characters: no index
    answers it)."""
    client, store = pages_client, pages_store
    erin = await user_headers("erin")
    infos = await seed(store, "erin", 600)
    assert infos
    for path, params in (
        (f"{BASE}/search", {"sort_order": "UPDATED_AT_DESC", "title__contains": "zz"}),
        (f"{BASE}/search", {"title__contains": "zz"}),
        ("/api/conversations", {"selected_repository": "nobody/none"}),
    ):
        await raw_redis.config_resetstat()
        resp = await client.get(path, params=params | {"limit": "1"}, headers=erin)
        assert resp.status == 200, await resp.text()
        body: Any = await resp.json()
        assert body.get("items", body.get("results")) == []
        stats: Any = await raw_redis.info("commandstats")
        assert stats["cmdstat_mget"]["calls"] <= 12, (path, stats["cmdstat_mget"])


TITLES = ["Fix the build", "fix the build", "Änderung", "zebra", "", "Écrire", "a" * 80, "b"]


async def seed_titled(store: ConversationStore, user: str, n: int) -> list[AppConversationInfo]:
    """`n` conversations of `user` with titles that tie (in case, and beyond the sorted
    characters), begin alike, are empty or are not ASCII: written with their titles."""
    infos = []
    for i in range(n):
        title = TITLES[i % len(TITLES)] + ("" if i < len(TITLES) else f" {i % 5}")
        info = AppConversationInfo(
            id=uuid7_hex(), created_by_user_id=user, sandbox_id="s-t", title=title or None
        )
        await store.create(info)
        infos.append(info)
    return infos


def by_title(infos: list[AppConversationInfo], *, desc: bool) -> list[str]:
    """(lowercased title, id) order, as Python compares strings (code points)."""
    ordered = sorted(infos, key=lambda i: ((i.title or "").lower()[:64], i.id), reverse=desc)
    return [i.id for i in ordered]


async def test_title_orders_page_by_the_index_each_id_once_in_order(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    client, store = pages_client, pages_store
    alice = await user_headers("alice")
    infos = await seed_titled(store, "alice", 40)
    await store.create(  # another user's: never in alice's pages
        AppConversationInfo(id=uuid7_hex(), created_by_user_id="bob", sandbox_id="s", title="a")
    )
    await assert_orders(
        client,
        alice,
        {"TITLE": by_title(infos, desc=False), "TITLE_DESC": by_title(infos, desc=True)},
    )

    # A rename moves the conversation to its new place; its old member leaves.
    moved = by_title(infos, desc=True)[0]
    resp = await client.patch(f"{BASE}/{moved}", json={"title": "AAA first"}, headers=alice)
    assert resp.status == 200, await resp.text()
    next(i for i in infos if i.id == moved).title = "AAA first"
    seen = await pages(client, alice, f"{BASE}/search", sort_order="TITLE", limit="7")
    assert seen == by_title(infos, desc=False)
    assert seen.index(moved) < len(infos) // 4  # after the empty titles, before the rest
    index = keyspace.user_conversations_by_title("alice")
    assert await raw_redis.zcard(index) == len(infos)

    # A deleted conversation leaves the index with its record.
    resp = await client.delete(f"{BASE}/{moved}", headers=alice)
    assert resp.status == 200, await resp.text()
    members: Any = await raw_redis.zrange(index, 0, -1)
    assert [m for m in members if m.endswith(moved.encode())] == []

    # A cursor this API cannot have issued: not base64url, or not UTF-8 inside.
    for bad in ("t!!!", "t_w"):
        resp = await client.get(
            f"{BASE}/search", params={"sort_order": "TITLE", "page_id": bad}, headers=alice
        )
        assert resp.status == 422, (bad, await resp.text())


async def test_a_title_page_reads_about_a_page_of_records(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    client, store = pages_client, pages_store
    alice = await user_headers("alice")
    infos = await seed_titled(store, "alice", 60)
    ordered = by_title(infos, desc=False)
    await spoil_all_but(raw_redis, infos, set(ordered[:4]))
    resp = await client.get(
        f"{BASE}/search", params={"sort_order": "TITLE", "limit": "3"}, headers=alice
    )
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert [i["id"] for i in body["items"]] == ordered[:3]
    assert body["next_page_id"].startswith("t")


async def test_a_title_index_out_of_step_is_put_right_by_the_next_title_search(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    """A rolling upgrade: replicas of a version without the index by title create, rename and
    delete conversations meanwhile (the record and the user's index only). A create or a delete
    puts the two indexes' sizes apart: the next title search rebuilds; a rename leaves a member
    its record no longer matches: the search that meets it skips it and puts it right."""
    client, store = pages_client, pages_store
    carol = await user_headers("carol")
    infos = await seed_titled(store, "carol", 12)
    index = keyspace.user_conversations_by_title("carol")
    old = AppConversationInfo(id=uuid7_hex(), created_by_user_id="carol", sandbox_id="s", title="m")
    await raw_redis.set(keyspace.conversation(old.id), old.model_dump_json())
    await raw_redis.zadd(keyspace.user_conversations("carol"), {old.id: 0})
    infos.append(old)
    seen = await pages(client, carol, f"{BASE}/search", sort_order="TITLE", limit="5")
    assert seen == by_title(infos, desc=False)

    gone = infos.pop(3)
    await raw_redis.delete(keyspace.conversation(gone.id))
    await raw_redis.zrem(keyspace.user_conversations("carol"), gone.id)
    seen = await pages(client, carol, f"{BASE}/search", sort_order="TITLE_DESC", limit="5")
    assert seen == by_title(infos, desc=True)
    assert await raw_redis.zcard(index) == len(infos)

    renamed = infos[5]
    renamed.title = "zzz renamed"
    await raw_redis.set(keyspace.conversation(renamed.id), renamed.model_dump_json())
    seen = await pages(client, carol, f"{BASE}/search", sort_order="TITLE", limit="100")
    assert seen == by_title([i for i in infos if i is not renamed], desc=False)  # skipped once
    seen = await pages(client, carol, f"{BASE}/search", sort_order="TITLE", limit="100")
    assert seen == by_title(infos, desc=False)  # and put right
    assert title_member(renamed).encode() in await raw_redis.zrange(index, 0, -1)
    assert await raw_redis.zcard(index) == len(infos)


async def test_start_task_pages_read_about_a_page_in_id_order(
    pages_client: Client,
    pages_store: ConversationStore,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    """The created-at orders of start tasks (the default) page the user's index of task ids
    from an id cursor, the updated-at orders their index by update (test_task_indexes.py); an
    unfiltered count is the index's size."""
    client, store = pages_client, pages_store
    alice = await user_headers("alice")
    conversation = uuid7_hex()
    tasks: list[AppConversationStartTask] = []
    for i in range(40):
        task = AppConversationStartTask(
            id=uuid7_hex(),
            created_by_user_id="alice",
            request=AppConversationStartRequest(),
            # Finished: no replica's recovery of unleased tasks saves (moves) it meanwhile.
            status=StartTaskStatus.READY,
            app_conversation_id=conversation if i % 7 == 3 else None,
        )
        await store.save_task(task)
        tasks.append(task)
    await store.save_task(  # another user's: never in alice's pages
        AppConversationStartTask(
            id=uuid7_hex(), created_by_user_id="bob", request=AppConversationStartRequest()
        )
    )
    path = f"{BASE}/start-tasks/search"
    newest = sorted((t.id for t in tasks), reverse=True)
    mine = sorted((t.id for t in tasks if t.app_conversation_id), reverse=True)
    for limit in ("1", "7", "100"):
        assert await pages(client, alice, path, limit=limit) == newest
        asc = await pages(client, alice, path, limit=limit, sort_order="CREATED_AT")
        assert asc == newest[::-1]
        assert (
            await pages(client, alice, path, limit=limit, conversation_id__eq=conversation) == mine
        )
        by_update = await pages(client, alice, path, limit=limit, sort_order="UPDATED_AT")
        assert by_update == [t.id for t in tasks]  # saved (updated) in creation order
    # The first page of 3 needs the newest 3 tasks and reads at most one more; the count none.
    # (Ids minted in one millisecond need not be in the order of their saves: the newest
    # updated are kept readable apart.)
    updated = [t.id for t in sorted(tasks, key=lambda t: (t.updated_at, t.id), reverse=True)]
    for task in tasks:
        if task.id not in newest[:4] + updated[:4]:
            await raw_redis.set(keyspace.start_task(task.id), b"{not json")
    resp = await client.get(path, params={"limit": "3"}, headers=alice)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert [t["id"] for t in body["items"]] == newest[:3]
    assert body["next_page_id"] == newest[2]
    resp = await client.get(f"{BASE}/start-tasks/count", headers=alice)
    assert resp.status == 200, await resp.text()
    assert await resp.json() == 40
    # Newest updated first reads no more either; the oldest first needs the unreadable ones
    # (the control).
    resp = await client.get(
        path, params={"sort_order": "UPDATED_AT_DESC", "limit": "3"}, headers=alice
    )
    assert resp.status == 200, await resp.text()
    assert [t["id"] for t in (await resp.json())["items"]] == updated[:3]
    resp = await client.get(path, params={"sort_order": "UPDATED_AT", "limit": "3"}, headers=alice)
    assert resp.status == 500
