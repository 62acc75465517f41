"""Start tasks through their indexes (issue 30): the updated-at orders page the user's index by
update, a filtered count reads an index or a conversation's own tasks, a conversation's delete
reads its own tasks; each answers what reading every task did, reads about a page, and the
indexes are built for tasks written before them (at a start, and by the first request that
finds a user's out of step). Tasks the request must not need are made unreadable, so that a
request that read them would fail with a 500."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.conversations import service
from controlplane.conversations.models import (
    AppConversationInfo,
    AppConversationStartRequest,
    AppConversationStartTask,
    StartTaskStatus,
)
from controlplane.conversations.store import ConversationStore
from controlplane.conversations.task_index import NAME, TaskIndexes
from controlplane.ids import uuid7_hex
from controlplane.store import keyspace
from controlplane.store.paging import micros
from tests.conversations.test_search_pages import BASE, pages
from tests.support.records import NO_ENGINE
from tests.support.types import Client, ClientFactory, UserHeaders

TASKS = f"{BASE}/start-tasks"
START = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
async def tasks_client(make_client: ClientFactory) -> Client:
    return await make_client(with_sandboxes=True, docker_url=NO_ENGINE)


async def seed_tasks(
    store: ConversationStore, redis: aioredis.Redis, user: str, n: int, conversations: list[str]
) -> list[AppConversationStartTask]:
    """`n` finished tasks of `user`, each for one of `conversations` in turn (None for every fifth),
    then given updated-at times unlike their creation order, every fourth tied with the one
    before (ties broken by id), written as a save would (the record, then its indexes)."""
    tasks: list[AppConversationStartTask] = []
    for i in range(n):
        task = AppConversationStartTask(
            id=uuid7_hex(),
            created_by_user_id=user,
            request=AppConversationStartRequest(),
            status=StartTaskStatus.READY,  # done: no replica's recovery saves it again
            app_conversation_id=None if i % 5 == 4 else conversations[i % len(conversations)],
            created_at=START + timedelta(seconds=i),
        )
        await store.save_task(task)
        tasks.append(task)
    for i, task in enumerate(tasks):
        task.updated_at = START + timedelta(seconds=(i * 37) % n, microseconds=(i * 7919) % 1000)
        if i % 4 == 3:
            task.updated_at = tasks[i - 1].updated_at
        await redis.set(keyspace.start_task(task.id), task.model_dump_json())
    await store.task_indexes.index([t.id for t in tasks])
    return tasks


def old_order(
    tasks: list[AppConversationStartTask],
    order: str,
    conversation: str | None = None,
    since: datetime | None = None,
) -> list[str]:
    """What the old path answered: every task of the user, filtered, sorted."""
    kept = [
        t
        for t in tasks
        if (conversation is None or t.app_conversation_id == conversation)
        and (since is None or t.created_at >= since)
    ]
    if order.startswith("CREATED"):
        kept.sort(key=lambda t: t.id, reverse=order.endswith("DESC"))
    else:
        kept.sort(key=lambda t: (t.updated_at, t.id), reverse=order.endswith("DESC"))
    return [t.id for t in kept]


async def count(client: Client, headers: dict[str, str], **params: str) -> int:
    resp = await client.get(f"{TASKS}/count", params=params, headers=headers)
    assert resp.status == 200, await resp.text()
    found: int = await resp.json()
    return found


async def test_task_pages_and_counts_answer_what_reading_every_task_did(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client, store = tasks_client, ConversationStore(raw_redis)
    alice = await user_headers("alice")
    conversations = [uuid7_hex(), uuid7_hex(), uuid7_hex()]
    tasks = await seed_tasks(store, raw_redis, "alice", 45, conversations)
    await seed_tasks(store, raw_redis, "bob", 5, conversations[:1])  # never in alice's
    since = tasks[20].created_at
    for order in ("UPDATED_AT", "UPDATED_AT_DESC", "CREATED_AT", "CREATED_AT_DESC"):
        for limit in ("1", "7", "100"):
            seen = await pages(client, alice, f"{TASKS}/search", sort_order=order, limit=limit)
            assert seen == old_order(tasks, order), (order, limit)
            one = conversations[1]
            seen = await pages(
                client,
                alice,
                f"{TASKS}/search",
                sort_order=order,
                limit=limit,
                conversation_id__eq=one,
            )
            assert seen == old_order(tasks, order, one), (order, limit)
            seen = await pages(
                client,
                alice,
                f"{TASKS}/search",
                sort_order=order,
                limit=limit,
                created_at__gte=since.isoformat(),
            )
            assert seen == old_order(tasks, order, since=since), (order, limit)
    for conversation in [*conversations, uuid7_hex()]:
        expected = len(old_order(tasks, "CREATED_AT", conversation))
        assert await count(client, alice, conversation_id__eq=conversation) == expected
        expected = len(old_order(tasks, "CREATED_AT", conversation, since))
        assert (
            await count(
                client, alice, conversation_id__eq=conversation, created_at__gte=since.isoformat()
            )
            == expected
        )
    for at in (START - timedelta(days=1), since, since + timedelta(microseconds=1)):
        expected = len(old_order(tasks, "CREATED_AT", since=at))
        assert await count(client, alice, created_at__gte=at.isoformat()) == expected
    assert await count(client, alice) == 45


async def test_task_pages_and_counts_read_about_a_page(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client, store = tasks_client, ConversationStore(raw_redis)
    alice = await user_headers("alice")
    conversations = [uuid7_hex() for _ in range(8)]
    tasks = await seed_tasks(store, raw_redis, "alice", 80, conversations)
    newest = old_order(tasks, "UPDATED_AT_DESC")
    mine = conversations[3]
    keep = set(newest[:4]) | {t.id for t in tasks if t.app_conversation_id == mine}
    for task in tasks:
        if task.id not in keep:
            await raw_redis.set(keyspace.start_task(task.id), b"{not json")
    params = {"sort_order": "UPDATED_AT_DESC", "limit": "3"}
    resp = await client.get(f"{TASKS}/search", params=params, headers=alice)
    assert resp.status == 200, await resp.text()
    body: Any = await resp.json()
    assert [t["id"] for t in body["items"]] == newest[:3]
    third = next(t for t in tasks if t.id == newest[2])
    assert body["next_page_id"] == f"{micros(third.updated_at)}-{third.id}"
    # A conversation's tasks, a count of them and a count from a time read no other task.
    assert await pages(
        client, alice, f"{TASKS}/search", conversation_id__eq=mine, limit="2"
    ) == old_order(tasks, "CREATED_AT_DESC", mine)
    assert await count(client, alice, conversation_id__eq=mine) == len(
        old_order(tasks, "CREATED_AT", mine)
    )
    since = tasks[30].created_at
    assert await count(client, alice, created_at__gte=since.isoformat()) == 50


async def test_updated_pages_under_concurrent_saves_list_each_task_once_in_order(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    """Saves while a client pages: every task not saved meanwhile is listed once, in order; a
    task saved meanwhile is listed where its time put it when its page was read."""
    client, store = tasks_client, ConversationStore(raw_redis)
    alice = await user_headers("alice")
    tasks = await seed_tasks(store, raw_redis, "alice", 60, [uuid7_hex()])
    moved: set[str] = set()

    async def saves() -> None:
        for task in tasks[::6]:
            await store.save_task(task)  # now: the newest
            moved.add(task.id)
            await asyncio.sleep(0.005)

    for order in ("UPDATED_AT_DESC", "UPDATED_AT"):
        before = old_order(tasks, order)
        moved.clear()
        saving = asyncio.create_task(saves())
        seen = await pages(client, alice, f"{TASKS}/search", sort_order=order, limit="4")
        await saving
        assert [i for i in seen if i not in moved] == [i for i in before if i not in moved]
        # Newest first, a saved task moves behind the cursor: none listed twice. Oldest first
        # it moves ahead and may be listed again where its new time puts it, never more.
        twice = {i for i in seen if seen.count(i) > 1}
        assert twice <= moved
        if order == "UPDATED_AT_DESC":
            assert not twice
        assert all(seen.count(i) <= 2 for i in seen)
        for task in tasks:  # back to the seeded times for the next order
            await raw_redis.set(keyspace.start_task(task.id), task.model_dump_json())
        await store.task_indexes.index([t.id for t in tasks])


async def test_a_conversation_delete_reads_its_own_tasks(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client, store = tasks_client, ConversationStore(raw_redis)
    alice = await user_headers("alice")
    info = AppConversationInfo(id=uuid7_hex(), created_by_user_id="alice", sandbox_id="s-none")
    await store.save(info)
    other = uuid7_hex()
    tasks = await seed_tasks(store, raw_redis, "alice", 30, [info.id, other])
    doomed = {t.id for t in tasks if t.app_conversation_id == info.id}
    for task in tasks:
        if task.id not in doomed:
            await raw_redis.set(keyspace.start_task(task.id), b"{not json")
    resp = await client.delete(f"{BASE}/{info.id}", headers=alice)
    assert resp.status == 200, await resp.text()
    for task in tasks:
        gone = await raw_redis.exists(keyspace.start_task(task.id)) == 0
        assert gone == (task.id in doomed)
        listed = await raw_redis.zscore(keyspace.user_start_tasks("alice"), task.id) is not None
        by_update = keyspace.user_start_tasks_by_update("alice")
        assert listed == (task.id not in doomed)
        assert (await raw_redis.zscore(by_update, task.id) is not None) == listed
    assert not await raw_redis.exists(keyspace.conversation_start_tasks(info.id))
    assert await raw_redis.scard(keyspace.conversation_start_tasks(other)) == 12


async def write_unindexed(redis: aioredis.Redis, tasks: list[AppConversationStartTask]) -> None:
    """Tasks as a version without the indexes wrote them: the record and the user's list."""
    for task in tasks:
        await redis.set(keyspace.start_task(task.id), task.model_dump_json())
        await redis.zadd(keyspace.user_start_tasks(task.created_by_user_id or ""), {task.id: 0})


def unindexed(user: str, n: int, conversation: str) -> list[AppConversationStartTask]:
    return [
        AppConversationStartTask(
            id=uuid7_hex(),
            created_by_user_id=user,
            request=AppConversationStartRequest(),
            status=StartTaskStatus.READY,
            app_conversation_id=conversation if i % 2 else None,
            created_at=START + timedelta(seconds=i),
            updated_at=START + timedelta(seconds=(i * 13) % n),
        )
        for i in range(n)
    ]


async def test_the_migration_indexes_tasks_written_without_it_once_across_two_replicas(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client = tasks_client
    dan = await user_headers("dan")
    conversation = uuid7_hex()
    tasks = unindexed("dan", 1200, conversation)  # more than one batch of the walk
    await write_unindexed(raw_redis, tasks)
    await raw_redis.srem(keyspace.MIGRATIONS, NAME)  # the app's start applied it before
    applied = await asyncio.gather(
        TaskIndexes(raw_redis).migrate(), TaskIndexes(raw_redis).migrate()
    )
    assert sorted(applied) == [False, True]  # one replica did it; the other went on
    assert await raw_redis.sismember(keyspace.MIGRATIONS, NAME)
    assert await TaskIndexes(raw_redis).migrate() is False  # once per deployment
    assert await raw_redis.zcard(keyspace.user_start_tasks_by_update("dan")) == 1200
    assert await raw_redis.zcard(keyspace.user_start_tasks_by_creation("dan")) == 1200
    assert await raw_redis.scard(keyspace.conversation_start_tasks(conversation)) == 600
    # The first page of the updated-at order reads one batch of tasks (limit + 1): the index.
    await raw_redis.config_resetstat()
    resp = await client.get(
        f"{TASKS}/search", params={"sort_order": "UPDATED_AT", "limit": "5"}, headers=dan
    )
    assert resp.status == 200, await resp.text()
    assert [t["id"] for t in (await resp.json())["items"]] == old_order(tasks, "UPDATED_AT")[:5]
    stats: Any = await raw_redis.info("commandstats")
    assert stats["cmdstat_mget"]["calls"] == 1
    since = tasks[1000].created_at
    assert await count(client, dan, created_at__gte=since.isoformat()) == 200
    assert await count(client, dan, conversation_id__eq=conversation) == 600


async def test_a_user_out_of_step_is_put_right_by_the_next_request(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    """Tasks saved by an older replica after the migration (a rolling upgrade): the next
    indexed request finds the user's indexes short and rebuilds them first."""
    client, store = tasks_client, ConversationStore(raw_redis)
    erin = await user_headers("erin")
    conversation = uuid7_hex()
    indexed = await seed_tasks(store, raw_redis, "erin", 10, [conversation])
    late = unindexed("erin", 7, conversation)
    await write_unindexed(raw_redis, late)
    everything = indexed + late
    assert await pages(
        client, erin, f"{TASKS}/search", sort_order="UPDATED_AT_DESC", limit="3"
    ) == old_order(everything, "UPDATED_AT_DESC")
    expected = len(old_order(everything, "CREATED_AT", conversation))
    assert await count(client, erin, conversation_id__eq=conversation) == expected


async def test_the_index_script_never_undoes_a_newer_save(raw_redis: aioredis.Redis) -> None:
    store = ConversationStore(raw_redis)
    task = AppConversationStartTask(
        id=uuid7_hex(), created_by_user_id="fay", request=AppConversationStartRequest()
    )
    await store.save_task(task)
    old = json.loads(await raw_redis.get(keyspace.start_task(task.id)) or b"")
    await store.save_task(task)  # saved since the walk read it
    args = [task.id, "fay", 7, 7, old["updated_at"], ""]
    await store.task_indexes._index(args=args)
    by_update = keyspace.user_start_tasks_by_update("fay")
    assert await raw_redis.zscore(by_update, task.id) == micros(task.updated_at)


TITLES = ["Fix the build", "fix THE tests", "Änderung am Build", "zebra", "", "a" * 70 + " build"]


async def test_a_title_count_reads_the_records_its_index_says_may_match(
    tasks_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    """The count with `title__contains` answers what reading every record did (any case, a
    match past the index's cut characters, a stale member), reading only the candidates."""
    client, store = tasks_client, ConversationStore(raw_redis)
    gil = await user_headers("gil")
    infos: list[AppConversationInfo] = []
    for i in range(60):
        title = TITLES[i % len(TITLES)] or None
        info = AppConversationInfo(
            id=uuid7_hex(), created_by_user_id="gil", sandbox_id="s-t", title=title
        )
        await store.create(info)
        infos.append(info)
    # Renamed by a writer that did not know the index: its member still says "zebra".
    infos[3].title = "renamed"
    await raw_redis.set(keyspace.conversation(infos[3].id), infos[3].model_dump_json())

    def old_count(needle: str) -> int:
        return sum(1 for i in infos if needle.lower() in (i.title or "").lower())

    for needle in ("build", "BUILD", "the", "zebra", "ä", "a" * 65, "nothing", " "):
        resp = await client.get(f"{BASE}/count", params={"title__contains": needle}, headers=gil)
        assert resp.status == 200, await resp.text()
        assert await resp.json() == old_count(needle), needle
    # Records the index rules out are not read: spoiled, the count of "zebra" still answers.
    for info in infos:
        if (
            "zebra" not in (info.title or "")
            and len(info.title or "") < 64
            and info is not infos[3]
        ):
            await raw_redis.set(keyspace.conversation(info.id), b"{not json")
    resp = await client.get(f"{BASE}/count", params={"title__contains": "zebra"}, headers=gil)
    assert resp.status == 200, await resp.text()
    assert await resp.json() == old_count("zebra")


async def test_a_filtered_search_page_reads_at_most_its_budget(
    tasks_client: Client,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A filter no index answers (a title query of two characters), that few records match:
    each page reads at most PAGE_BUDGET records and answers what it found (maybe nothing) with
    a cursor there; the pages together list exactly what one unbounded read did, in every
    order."""
    monkeypatch.setattr(service, "PAGE_BUDGET", 40)
    client, store = tasks_client, ConversationStore(raw_redis)
    hal = await user_headers("hal")
    infos: list[AppConversationInfo] = []
    for i in range(300):
        info = AppConversationInfo(
            id=uuid7_hex(),
            created_by_user_id="hal",
            sandbox_id="s-b",
            title="needle here" if i % 97 == 5 else f"hay {i}",
            updated_at=START + timedelta(seconds=(i * 37) % 300),
        )
        await store.create(info)
        infos.append(info)
    matching = [i for i in infos if "needle" in (i.title or "")]
    expected = {
        "CREATED_AT_DESC": sorted((i.id for i in matching), reverse=True),
        "CREATED_AT": sorted(i.id for i in matching),
        "UPDATED_AT_DESC": [
            i.id for i in sorted(matching, key=lambda i: (i.updated_at, i.id), reverse=True)
        ],
        "UPDATED_AT": [i.id for i in sorted(matching, key=lambda i: (i.updated_at, i.id))],
        "TITLE": sorted(i.id for i in matching),  # one title: id order
    }
    for order, ids in expected.items():
        path = f"{BASE}/search"
        params = {"sort_order": order, "title__contains": "ED", "limit": "2"}
        seen: list[str] = []
        page: str | None = None
        requests = 0
        while True:
            await raw_redis.config_resetstat()
            resp = await client.get(
                path, params=params | ({"page_id": page} if page else {}), headers=hal
            )
            assert resp.status == 200, await resp.text()
            body: Any = await resp.json()
            stats: Any = await raw_redis.info("commandstats")
            read = stats["cmdstat_mget"]["calls"]
            assert read <= 4, (order, read)  # 3, 6, 12, 24 records: the budget's 40 crossed
            seen += [i["id"] for i in body["items"]]
            requests += 1
            page = body["next_page_id"]
            if page is None:
                break
        assert seen == ids, order
        assert requests >= 300 // 45, order  # bounded pages: several, not one read of all
