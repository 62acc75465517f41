"""Conversations by creation time and by title's trigrams (issue 30, item 4): a count from a
creation time is a ZCOUNT, a page within creation bounds pages the index by creation, a title
query of three characters or more reads the records its trigrams' sets hold in common. Each
answers what reading every record of the user did (random titles: unicode, case, overlapping
trigrams, renames, deletes); the indexes are built for records written before them (the
migration, and the first request that finds a user's out of step); and the work of a request
does not grow with the user's conversations (records it must not need are made unreadable, and
the Redis commands it issues are the same for 50 conversations as for 2,500)."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.conversations import service
from controlplane.conversations.indexes import (
    NAME,
    TRIGRAM_CHARS,
    ConversationIndexes,
    bucket,
    indexed_title,
    title_keys,
    trigrams,
)
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore, title_member
from controlplane.store import keyspace, text
from controlplane.store.paging import micros
from tests.conversations.test_search_pages import BASE, pages
from tests.support.types import Client, UserHeaders

START = datetime(2026, 11, 1, tzinfo=UTC)
ORDERS = ("CREATED_AT_DESC", "CREATED_AT", "UPDATED_AT_DESC", "UPDATED_AT", "TITLE", "TITLE_DESC")
PIECES = [
    "build",
    "Build",
    "BUILD",
    "fix",
    "Änderung",
    "ÄNDERUNG",
    "straße",
    "STRASSE",
    "İstanbul",
    "日本語のテスト",
    "😀😀x",
    "aaaa",
    "abab",
    "abc",
    "bca",
    "x",
]


def random_title(rng: random.Random) -> str | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.08:
        return "İ" * 150 + " build tail"  # lowercased: 311 characters, past TRIGRAM_CHARS
    if roll < 0.1:
        return "long " * 45 + "abc"  # 228 characters (written past the API's 200)
    parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 4))]
    return "".join(rng.choice(["", " ", "-"]) + p for p in parts).strip() or "x"


async def seed_random(
    store: ConversationStore, rng: random.Random, user: str, n: int
) -> list[AppConversationInfo]:
    """`n` conversations of `user` with client-chosen ids (no creation order), creation times
    unlike their ids' order (every fifth tied with the one before), random titles."""
    infos: list[AppConversationInfo] = []
    for i in range(n):
        created = START + timedelta(seconds=rng.randint(0, 10_000), microseconds=i)
        if i % 5 == 4:
            created = infos[-1].created_at
        info = AppConversationInfo(
            id=uuid.UUID(int=rng.getrandbits(128)).hex,
            created_by_user_id=user,
            sandbox_id="s-idx",
            title=random_title(rng),
            created_at=created,
            updated_at=START + timedelta(seconds=rng.randint(0, 10_000)),
        )
        await store.create(info)
        infos.append(info)
    return infos


async def records_of(store: ConversationStore, user: str) -> list[AppConversationInfo]:
    """What reading every record of the user answers."""
    return [i for i in await store.get_many(await store.all_ids(user)) if i is not None]


def brute(
    records: list[AppConversationInfo],
    order: str,
    needle: str | None = None,
    gte: datetime | None = None,
    lt: datetime | None = None,
) -> list[str]:
    kept = [
        r
        for r in records
        if (needle is None or needle.lower() in (r.title or "").lower())
        and (gte is None or r.created_at >= gte)
        and (lt is None or r.created_at < lt)
    ]
    key: Callable[[AppConversationInfo], Any]
    if order.startswith("CREATED"):
        bounded = gte is not None or lt is not None
        key = (lambda r: (r.created_at, r.id)) if bounded else (lambda r: r.id)
    elif order.startswith("UPDATED"):
        key = lambda r: (r.updated_at, r.id)  # noqa: E731
    else:
        key = title_member
    return [r.id for r in sorted(kept, key=key, reverse=order.endswith("DESC"))]


async def count(client: Client, headers: dict[str, str], **params: str) -> int:
    resp = await client.get(f"{BASE}/count", params=params, headers=headers)
    assert resp.status == 200, await resp.text()
    found: int = await resp.json()
    return found


async def assert_index_exact(redis: aioredis.Redis, user: str) -> None:
    """The user's trigram index holds exactly what the records say: each bucket's set the ids
    whose indexed title has a trigram of it, the titles hash each record's indexed title, the
    cut set the records whose lowercased title is longer; the index by creation each record's
    time. Nothing is left of the user's index of v1 (a set per trigram)."""
    store = ConversationStore(redis)
    records = await records_of(store, user)
    want: dict[str, set[str]] = {}
    for r in records:
        for gram in trigrams(indexed_title(r)[0]):
            want.setdefault(bucket(gram), set()).add(r.id)
    prefix = keyspace.user_title_buckets(user)
    have: dict[str, set[str]] = {}
    async for key in redis.scan_iter(match=prefix + "*", count=1000):
        name = text(key).removeprefix(prefix)
        have[name] = {text(m) for m in await redis.smembers(key)}
    assert have == want
    assert not await redis.exists(keyspace.user_conversation_titles_v1(user))
    v1 = keyspace.user_title_trigrams_v1(user)
    assert not [k async for k in redis.scan_iter(match=v1 + "*", count=1000)]
    titles = await redis.hgetall(keyspace.user_conversation_titles(user))
    assert {text(k): text(v) for k, v in titles.items()} == {
        r.id: indexed_title(r)[0] for r in records
    }
    cut = {text(m) for m in await redis.smembers(keyspace.user_cut_titles(user))}
    assert cut == {r.id for r in records if indexed_title(r)[1]}
    created: Any = await redis.zrange(
        keyspace.user_conversations_by_creation(user), 0, -1, withscores=True
    )
    assert {text(m): int(s) for m, s in created} == {r.id: micros(r.created_at) for r in records}


async def assert_answers(
    client: Client,
    headers: dict[str, str],
    records: list[AppConversationInfo],
    needles: list[str],
    bounds: list[tuple[datetime | None, datetime | None]],
) -> None:
    for needle in needles:
        for gte, lt in bounds:
            params = {"title__contains": needle} | _times(gte, lt)
            expected = brute(records, "CREATED_AT", needle, gte, lt)
            assert await count(client, headers, **params) == len(expected), params
    for gte, lt in bounds:
        if gte is None and lt is None:
            continue
        assert await count(client, headers, **_times(gte, lt)) == len(
            brute(records, "CREATED_AT", None, gte, lt)
        )
        both = _times(gte, lt) | {"updated_at__gte": (START + timedelta(seconds=5000)).isoformat()}
        expected_both = [
            i
            for i in brute(records, "CREATED_AT", None, gte, lt)
            if next(r for r in records if r.id == i).updated_at >= START + timedelta(seconds=5000)
        ]
        assert await count(client, headers, **both) == len(expected_both)
        for order in ("CREATED_AT_DESC", "CREATED_AT"):
            seen = await pages(
                client, headers, f"{BASE}/search", sort_order=order, limit="9", **_times(gte, lt)
            )
            assert seen == brute(records, order, None, gte, lt), (order, gte, lt)
    for n, needle in enumerate(needles):
        for order in ORDERS:
            for limit in ("4",) if n % 2 else ("100",):
                gte, lt = bounds[-1]
                for times in ({}, _times(gte, lt)):
                    seen = await pages(
                        client,
                        headers,
                        f"{BASE}/search",
                        sort_order=order,
                        limit=limit,
                        title__contains=needle,
                        **times,
                    )
                    expected = brute(
                        records,
                        order,
                        needle,
                        gte if times else None,
                        lt if times else None,
                    )
                    assert seen == expected, (needle, order, limit, times)


def _times(gte: datetime | None, lt: datetime | None) -> dict[str, str]:
    return ({"created_at__gte": gte.isoformat()} if gte else {}) | (
        {"created_at__lt": lt.isoformat()} if lt else {}
    )


async def test_counts_and_pages_answer_what_reading_every_record_did(
    index_client: Client,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, store = index_client, ConversationStore(raw_redis)
    rng = random.Random(30)
    alice = await user_headers("alice")
    infos = await seed_random(store, rng, "alice", 150)
    await seed_random(store, rng, "bob", 30)  # never in alice's answers
    # Renames (through the API and the store), and deletes.
    for info in rng.sample(infos, 25):
        title = random_title(rng) or "renamed"
        resp = await client.patch(f"{BASE}/{info.id}", json={"title": title[:200]}, headers=alice)
        assert resp.status == 200, await resp.text()
    for info in rng.sample(infos, 15):

        def change(record: AppConversationInfo, title: str | None = random_title(rng)) -> None:
            record.title = title

        await store.update(info.id, change)
    doomed = rng.sample(infos, 20)
    for info in doomed[:10]:
        resp = await client.delete(f"{BASE}/{info.id}", headers=alice)
        assert resp.status == 200, await resp.text()
    for info in doomed[10:]:
        await store.delete(info)
    await assert_index_exact(raw_redis, "alice")
    records = await records_of(store, "alice")
    assert len(records) == 130
    titles = [r.title or "" for r in records]
    needles = ["build", "BUILD", "änd", "STRASSE", "ß", "i̇st", "İst", "日本語", "😀😀", "aaa"]
    needles += ["abab", "bab", "ab", "a", " ", "abca", "xyz", "ild tail", "long long", "i̇i̇i̇"]
    for _ in range(10):  # random pieces of the titles, in random case
        title = rng.choice([t for t in titles if len(t) >= 4])
        at = rng.randrange(len(title) - 3)
        piece = title[at : at + rng.randint(3, 6)]
        needles.append(piece.upper() if rng.random() < 0.5 else piece)
    times = sorted(r.created_at for r in records)
    bounds: list[tuple[datetime | None, datetime | None]] = [
        (None, None),
        (times[40], None),
        (None, times[90]),
        (times[20], times[21]),  # a tie: both bounds on the same instant
        (times[30], times[100]),
    ]
    await assert_answers(client, alice, records, needles, bounds)
    # Past the budget the title's candidates are not read: the order's index is paged with the
    # filter (a page may come back short, with a cursor), and the pages say the same.
    monkeypatch.setattr(service, "PAGE_BUDGET", 5)
    await assert_answers(client, alice, records, needles[:6], bounds[-1:])
    # Every conversation gone: nothing of the index is left.
    for record in records:
        await store.delete(record)
    for key in [*title_keys("alice")[:2], keyspace.user_conversations_by_creation("alice")]:
        assert not await raw_redis.exists(key)
    assert not [k async for k in raw_redis.scan_iter(match=title_keys("alice")[2] + "*")]


async def seed_plain(store: ConversationStore, user: str, n: int) -> list[AppConversationInfo]:
    """`n` conversations of `user` created a second apart (ids in no order), titled "chat <i>"
    but for three titled "Needle <i>"."""
    infos = []
    for i in range(n):
        info = AppConversationInfo(
            id=uuid.uuid4().hex,
            created_by_user_id=user,
            sandbox_id="s-plain",
            title=f"Needle {i}" if i in (3, n // 2, n - 9) else f"chat {i}",
            created_at=START + timedelta(seconds=i),
        )
        await store.create(info)
        infos.append(info)
    return infos


def calls(stats: dict[str, Any]) -> dict[str, int]:
    """How often each command that reads the user's conversations or their indexes ran (not
    those of the replica's own background work: its streams, its leases). A call refused
    (NOSCRIPT: a script's first call on a new server, which then loads it, once per server
    whatever the user's size) is not counted."""
    counted = {k: v["calls"] - v.get("failed_calls", 0) for k, v in stats.items()}
    return {k: n for k, n in counted.items() if n and k.removeprefix("cmdstat_") in _READS}


_READS = {
    *("mget", "zrange", "zrangebylex", "zrangebyscore", "zcount", "zcard", "hlen", "hkeys"),
    *("sinter", "sintercard", "smembers", "scard", "sscan", "scan", "evalsha", "evalsha_ro"),
    "eval",
}


async def test_a_request_issues_the_same_commands_for_50_conversations_as_for_2500(
    index_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    """The count from a creation time, a page within creation bounds, a title's count and
    page: each reads no record it does not answer with (the others are unreadable: reading one
    would be a 500), and issues the same Redis commands, as many times, whatever the user's
    number of conversations (the index by title's scan took one ZRANGE a 2,000 members, the
    count from a time one MGET a 500 records)."""
    client, store = index_client, ConversationStore(raw_redis)
    issued: dict[int, list[dict[str, int]]] = {}
    for n in (50, 2500):
        user = f"u{n}"
        headers = await user_headers(user)
        infos = await seed_plain(store, user, n)
        since = START + timedelta(seconds=n - 5)
        needles = [i for i in infos if (i.title or "").startswith("Needle")]
        keep = {i.id for i in infos if i.created_at >= since} | {i.id for i in needles}
        for info in infos:
            if info.id not in keep:
                await raw_redis.set(keyspace.conversation(info.id), b"{not json")
        requests: list[tuple[str, dict[str, str], Any]] = [
            ("count", {"created_at__gte": since.isoformat()}, 5),
            ("count", {"created_at__lt": (START + timedelta(seconds=4)).isoformat()}, 4),
            ("count", {"title__contains": "needle"}, 3),
            (
                "search",
                {"created_at__gte": since.isoformat(), "limit": "5"},
                sorted((i for i in infos if i.created_at >= since), key=lambda i: i.created_at)[
                    ::-1
                ],
            ),
            (
                "search",
                {"title__contains": "NEEDLE", "limit": "20"},
                sorted(needles, key=lambda i: i.id)[::-1],
            ),
            (
                "search",
                {"title__contains": "eedl", "sort_order": "TITLE", "limit": "2"},
                sorted(needles, key=title_member)[:2],
            ),
        ]
        issued[n] = []
        for path, params, want in requests:
            await raw_redis.config_resetstat()
            resp = await client.get(f"{BASE}/{path}", params=params, headers=headers)
            assert resp.status == 200, (n, params, await resp.text())
            body: Any = await resp.json()
            if path == "count":
                assert body == want, (n, params)
            else:
                assert [i["id"] for i in body["items"]] == [i.id for i in want], (n, params)
            issued[n].append(calls(await raw_redis.info("commandstats")))
    assert issued[50] == issued[2500]
    assert all("cmdstat_mget" not in c for c in issued[50][:2])  # a count from a time: no record


async def unindex(redis: aioredis.Redis, user: str) -> None:
    """The user's records as a version without these indexes left them."""
    await redis.delete(keyspace.user_conversations_by_creation(user), *title_keys(user)[:2])
    async for key in redis.scan_iter(match=title_keys(user)[2] + "*"):
        await redis.delete(key)


async def test_the_migration_indexes_records_written_without_it_once_across_two_replicas(
    index_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client, store = index_client, ConversationStore(raw_redis)
    rng = random.Random(7)
    dan = await user_headers("dan")
    await seed_random(store, rng, "dan", 1100)  # more than two batches of the walk
    await seed_random(store, rng, "eve", 20)
    await unindex(raw_redis, "dan")
    await unindex(raw_redis, "eve")
    await raw_redis.srem(keyspace.MIGRATIONS, NAME)  # the app's start applied it before
    applied = await asyncio.gather(
        ConversationIndexes(raw_redis).migrate(), ConversationIndexes(raw_redis).migrate()
    )
    assert sorted(applied) == [False, True]  # one replica did it; the other went on
    assert await ConversationIndexes(raw_redis).migrate() is False  # once per deployment
    await assert_index_exact(raw_redis, "dan")
    await assert_index_exact(raw_redis, "eve")
    records = await records_of(store, "dan")
    # Built: a count from a time reads no record (nor rebuilds: no MGET at all).
    at = sorted(r.created_at for r in records)[700]
    await raw_redis.config_resetstat()
    assert await count(client, dan, created_at__gte=at.isoformat()) == len(
        brute(records, "CREATED_AT", gte=at)
    )
    assert "cmdstat_mget" not in await raw_redis.info("commandstats")
    for needle in ("build", "änd", "İst"):
        assert await count(client, dan, title__contains=needle) == len(
            brute(records, "CREATED_AT", needle)
        )
        seen = await pages(
            client, dan, f"{BASE}/search", title__contains=needle, limit="50", sort_order="TITLE"
        )
        assert seen == brute(records, "TITLE", needle)


async def test_a_user_out_of_step_is_put_right_by_the_next_request(
    index_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    """A record created, then one deleted, by an older replica after the migration (a rolling
    upgrade): the next request that reads the indexes finds the user's out of step with the
    user's index of ids (another size) and rebuilds them first. (A create and a delete between
    two requests of the user balance out: docs/conversations.md.)"""
    client, store = index_client, ConversationStore(raw_redis)
    rng = random.Random(11)
    fay = await user_headers("fay")
    infos = await seed_random(store, rng, "fay", 40)
    # An older replica's create: the record and the user's index, none of the new indexes.
    old = AppConversationInfo(
        id=uuid.uuid4().hex,
        created_by_user_id="fay",
        sandbox_id="s-old",
        title="Older BUILD",
        created_at=START - timedelta(days=1),
    )
    await raw_redis.set(keyspace.conversation(old.id), old.model_dump_json())
    await raw_redis.zadd(keyspace.user_conversations("fay"), {old.id: 0})
    records = await records_of(store, "fay")
    assert await count(client, fay, title__contains="build") == len(
        brute(records, "CREATED_AT", "build")
    )
    await assert_index_exact(raw_redis, "fay")
    assert await count(client, fay, created_at__lt=START.isoformat()) == 1
    # An older replica's delete: the record and the user's index; the new indexes left.
    gone = next(i for i in infos if "build" in (i.title or "").lower())
    await raw_redis.delete(keyspace.conversation(gone.id))
    await raw_redis.zrem(keyspace.user_conversations("fay"), gone.id)
    records = await records_of(store, "fay")
    seen = await pages(client, fay, f"{BASE}/search", title__contains="BUILD", limit="3")
    assert seen == brute(records, "CREATED_AT_DESC", "build")
    assert old.id in seen
    assert gone.id not in seen
    await assert_index_exact(raw_redis, "fay")
    assert await count(client, fay, created_at__gte=START.isoformat()) == len(records) - 1


async def test_the_index_script_never_undoes_a_newer_write(raw_redis: aioredis.Redis) -> None:
    store = ConversationStore(raw_redis)
    info = AppConversationInfo(
        id=uuid.uuid4().hex, created_by_user_id="gus", sandbox_id="s-g", title="first title"
    )
    await store.create(info)
    old = json.loads(await raw_redis.get(keyspace.conversation(info.id)) or b"")

    def rename(record: AppConversationInfo) -> None:
        record.title = "second title"

    await store.update(info.id, rename)  # written since the walk read it
    retitle = store.indexes._retitle
    await retitle(keys=title_keys("gus"), args=[info.id, "first title", 0, old["updated_at"]])
    await retitle(keys=title_keys("gus"), args=[info.id, "", "-", "!"])  # the record is there
    await assert_index_exact(raw_redis, "gus")
    hits = await store.indexes.title_candidates("gus", "second")
    assert hits == [info.id]
    assert await store.indexes.title_candidates("gus", "first") == []


def test_the_index_holds_at_most_trigram_chars_of_a_title() -> None:
    info = AppConversationInfo(id="0" * 32, created_by_user_id="h", sandbox_id="s", title="İ" * 150)
    title, cut = indexed_title(info)
    assert len(title) == TRIGRAM_CHARS
    assert cut
    assert len(trigrams(title)) <= TRIGRAM_CHARS - 2
    short = AppConversationInfo(
        id="0" * 32, created_by_user_id="h", sandbox_id="s", title="Ab" * 100
    )
    assert indexed_title(short) == (("ab" * 100), False)
