"""The trigram index's buckets (issue 30, review finding: a key per trigram let titles of
trigrams no other title holds cost ~50 KB a conversation). A user holds at most 4,096 keys of
the index whatever the titles; a query stays exact where other trigrams share its buckets
(dropped on their indexed title before any record is read); and the index of v1, a set per
trigram, is removed by the migration and by the first request that finds an older replica's v1
keys."""

from __future__ import annotations

import itertools
import random
import string
import uuid
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from controlplane.conversations import indexes as indexes_module
from controlplane.conversations.indexes import (
    BUCKET_DIGITS,
    NAME,
    ConversationIndexes,
    bucket,
    buckets,
    indexed_title,
    trigrams,
)
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.store import keyspace, text
from controlplane.store.paging import micros
from tests.conversations.test_conversation_indexes import (
    ORDERS,
    START,
    assert_index_exact,
    brute,
    count,
    records_of,
    seed_random,
)
from tests.conversations.test_search_pages import BASE, pages
from tests.support.types import Client, UserHeaders

HOSTILE = 300
"""Conversations of 200 random CJK characters: ~59,000 trigrams no other title holds."""


def cjk_title(rng: random.Random) -> str:
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(200))


async def create(store: ConversationStore, user: str, title: str, n: int) -> AppConversationInfo:
    info = AppConversationInfo(
        id=uuid.uuid4().hex,
        created_by_user_id=user,
        sandbox_id="s-buckets",
        title=title,
        created_at=START + timedelta(seconds=n),
    )
    await store.create(info)
    return info


async def keys_of(redis: aioredis.Redis, pattern: str) -> list[str]:
    return [text(k) async for k in redis.scan_iter(match=pattern, count=1000)]


async def test_hostile_titles_hold_at_most_4096_keys_and_stay_exact(
    index_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client, store = index_client, ConversationStore(raw_redis)
    rng = random.Random(4096)
    han = await user_headers("han")
    infos = [await create(store, "han", cjk_title(rng), n) for n in range(HOSTILE)]
    grams = set().union(*(trigrams(indexed_title(i)[0]) for i in infos))
    assert len(grams) > 10 * 16**BUCKET_DIGITS  # a key per trigram: that many keys
    prefix = keyspace.user_title_buckets("han")
    bucket_keys = await keys_of(raw_redis, prefix + "*")
    assert len(bucket_keys) <= 16**BUCKET_DIGITS == 4096
    # Every key of the user: the buckets and a handful of others (ids, indexes, the titles).
    assert len(await keys_of(raw_redis, "acs:user:han:*")) <= len(bucket_keys) + 10
    # A conversation costs its memberships, at most its title's trigrams.
    async with raw_redis.pipeline(transaction=False) as pipe:
        for key in bucket_keys:
            pipe.scard(key)
        sizes = await pipe.execute()
    assert sum(sizes) == sum(len(buckets(indexed_title(i)[0])) for i in infos)
    assert sum(sizes) <= HOSTILE * 198
    await assert_index_exact(raw_redis, "han")
    # Queries: a piece of one title (3 and 7 characters), a trigram of no title.
    records = await records_of(store, "han")
    target = infos[HOSTILE // 2].title or ""
    for needle in (target[90:93], target[10:17], "abc"):
        want = brute(records, "CREATED_AT", needle)
        assert await count(client, han, title__contains=needle) == len(want)
        seen = await pages(client, han, f"{BASE}/search", title__contains=needle, limit="5")
        assert seen == brute(records, "CREATED_AT_DESC", needle)
    assert infos[HOSTILE // 2].id in brute(records, "CREATED_AT", target[90:93])


def colliders(gram: str, n: int) -> list[str]:
    """`n` trigrams of lowercase letters and digits, not `gram`, in `gram`'s bucket (one in
    4,096 is: ~11 of the 46,656)."""
    alphabet = string.ascii_lowercase + string.digits
    want = bucket(gram)
    found = [
        "".join(c)
        for c in itertools.product(alphabet, repeat=3)
        if "".join(c) != gram and bucket("".join(c)) == want
    ]
    assert len(found) >= n, (gram, found)
    return found[:n]


async def test_a_query_stays_exact_where_other_trigrams_share_its_buckets(
    index_client: Client,
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Titles whose trigrams share the query's bucket (and, for a longer query, all of its
    buckets) without holding the query are in the buckets' intersection: they are dropped on
    their indexed title, no record read, and the answers are exact."""
    client, store = index_client, ConversationStore(raw_redis)
    ivy = await user_headers("ivy")
    near = colliders("qzx", 3)
    near_w = colliders("zxw", 2)
    titles = [f"Plan {c} one" for c in near]  # share bucket("qzx") only
    titles += [f"{near[0]} and {near_w[0]}", f"{near[1]}-{near_w[1]}"]  # both of "qzxw"'s
    titles += ["a QZX b", "qzxw at the start", "end: xqzxw", "nothing here"]
    infos = [await create(store, "ivy", t, n) for n, t in enumerate(titles)]
    ids = {i.title: i.id for i in infos}
    indexes = ConversationIndexes(raw_redis)
    prefix = keyspace.user_title_buckets("ivy")
    # The collisions are real: the buckets hold the titles that lack the query.
    in_bucket = {text(m) for m in await raw_redis.smembers(prefix + bucket("qzx"))}
    assert {ids[t] for t in titles[:5]} <= in_bucket
    both = {text(m) for m in await raw_redis.sinter([prefix + b for b in buckets("qzxw")])}
    assert {ids[t] for t in titles[3:5]} <= both
    # Dropped before any record is read.
    holding = [ids["a QZX b"], ids["qzxw at the start"], ids["end: xqzxw"]]
    assert await indexes.title_candidates("ivy", "qzx") == sorted(holding)
    assert await indexes.title_candidates("ivy", "qzxw", 100) == sorted(holding[1:])
    # More in the buckets than `most`: the caller walks its order's index instead.
    assert await indexes.title_candidates("ivy", "qzx", 2) is None
    # An id the titles hash lacks (out of step) is kept: its record decides.
    await raw_redis.hdel(keyspace.user_conversation_titles("ivy"), ids[titles[0]])
    assert ids[titles[0]] in (await indexes.title_candidates("ivy", "qzx") or [])
    await raw_redis.hset(
        keyspace.user_conversation_titles("ivy"), ids[titles[0]], titles[0].lower()
    )
    records = await records_of(store, "ivy")
    await assert_exact(client, ivy, records, near, near_w)
    # Of more than SAMPLE candidates, a sample's titles are read first: with few strangers in
    # it, the rest are kept unread (their records decide), else every title is read.
    monkeypatch.setattr(indexes_module, "SAMPLE", 2)
    monkeypatch.setattr(indexes_module, "STRANGERS", 2.0)  # always few: the rest unread
    loose = await indexes.title_candidates("ivy", "qzx") or []
    assert set(holding) < set(loose)
    assert len(loose) >= len(in_bucket) - 2  # the sample's strangers dropped, no more
    await assert_exact(client, ivy, records, near, near_w)
    monkeypatch.setattr(indexes_module, "STRANGERS", 0.0)  # never few: every title read
    assert await indexes.title_candidates("ivy", "qzx") == sorted(holding)


async def assert_exact(
    client: Client,
    headers: dict[str, str],
    records: list[AppConversationInfo],
    near: list[str],
    near_w: list[str],
) -> None:
    for needle in ("qzx", "QZXW", "zxw", "xqzx", near[0], f"{near[1]}-{near_w[1]}"):
        want = brute(records, "CREATED_AT", needle)
        assert await count(client, headers, title__contains=needle) == len(want), needle
        for order in ORDERS:
            seen = await pages(
                client,
                headers,
                f"{BASE}/search",
                title__contains=needle,
                limit="2",
                sort_order=order,
            )
            assert seen == brute(records, order, needle), (needle, order)


async def write_v1(redis: aioredis.Redis, records: list[AppConversationInfo]) -> None:
    """The records' trigram index as `conversation-indexes-v1` wrote it (a set per trigram, its
    titles hash), for each record not yet in it."""
    for r in records:
        user = r.created_by_user_id or ""
        title, cut = indexed_title(r)
        await redis.hset(keyspace.user_conversation_titles_v1(user), r.id, title)
        for gram in trigrams(title):
            await redis.sadd(keyspace.user_title_trigrams_v1(user) + gram, r.id)
        if cut:
            await redis.sadd(keyspace.user_cut_titles(user), r.id)


async def as_v1_left_it(
    redis: aioredis.Redis, user: str, records: list[AppConversationInfo]
) -> None:
    """The user's indexes as a deployment of v1 left them: no bucket, no titles hash of v2."""
    await redis.delete(keyspace.user_conversation_titles(user))
    for key in await keys_of(redis, keyspace.user_title_buckets(user) + "*"):
        await redis.delete(key)
    await write_v1(redis, records)


async def test_the_migration_replaces_v1s_trigram_keys_and_a_request_removes_later_ones(
    index_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    client, store = index_client, ConversationStore(raw_redis)
    rng = random.Random(2)
    jo = await user_headers("jo")
    await seed_random(store, rng, "jo", 120)
    # Hex-looking trigrams ("bad", "cafe", "123"): a v1 key of one is no bucket of v2.
    await create(store, "jo", "bad cafe 123 fed", 0)
    await seed_random(store, rng, "kim", 15)
    for user in ("jo", "kim"):
        await as_v1_left_it(raw_redis, user, await records_of(store, user))
    assert len(await keys_of(raw_redis, keyspace.user_title_trigrams_v1("jo") + "*")) > 50
    await raw_redis.sadd(keyspace.MIGRATIONS, "conversation-indexes-v1")
    await raw_redis.srem(keyspace.MIGRATIONS, NAME)  # the app's start applied it before
    assert await ConversationIndexes(raw_redis).migrate() is True
    await assert_index_exact(raw_redis, "jo")  # also: nothing of v1 is left
    await assert_index_exact(raw_redis, "kim")
    # An older replica still writing v1 (a rolling upgrade) creates a conversation: its record,
    # the user's index of ids and by creation, its v1 keys. The next request that reads the
    # indexes removes those and puts the user's right.
    old = AppConversationInfo(
        id=uuid.uuid4().hex,
        created_by_user_id="jo",
        sandbox_id="s-old",
        title="Older BUILD of v1",
        created_at=START - timedelta(days=1),
    )
    await raw_redis.set(keyspace.conversation(old.id), old.model_dump_json())
    await raw_redis.zadd(keyspace.user_conversations("jo"), {old.id: 0})
    await raw_redis.zadd(
        keyspace.user_conversations_by_creation("jo"), {old.id: micros(old.created_at)}
    )
    await write_v1(raw_redis, [old])
    records = await records_of(store, "jo")
    for needle in ("build", "bad", "cafe", "f v1"):
        assert await count(client, jo, title__contains=needle) == len(
            brute(records, "CREATED_AT", needle)
        ), needle
    assert old.id in await pages(client, jo, f"{BASE}/search", title__contains="of v1", limit="3")
    await assert_index_exact(raw_redis, "jo")


async def test_an_older_replicas_rename_and_swap_after_the_migration_are_found(
    index_client: Client, raw_redis: aioredis.Redis, user_headers: UserHeaders
) -> None:
    """Review finding: an older replica writing v1 during a rolling upgrade, after the
    migration ran, renames a conversation (the counts stay in step) or deletes one and creates
    another (the counts stay in step too). Its v1 keys say which ids it wrote: the next request
    indexes them again, so the renamed and the created conversations are found by their new
    titles (before, only a change of count set the index right: both were missing for good)."""
    client, store = index_client, ConversationStore(raw_redis)
    jo = await user_headers("jo")
    renamed = await create(store, "jo", "quarterly report draft", 1)
    gone = await create(store, "jo", "scratch notes", 2)
    await create(store, "jo", "unrelated planning", 3)
    await raw_redis.srem(keyspace.MIGRATIONS, NAME)
    await ConversationIndexes(raw_redis).migrate()
    await assert_index_exact(raw_redis, "jo")
    # The older replica's rename: the record and its v1 keys (its own indexes of ids are
    # shared with v2 and left as they are: the update score aside, nothing a search reads).
    new = renamed.model_copy(update={"title": "Zebra migration plan"})
    await raw_redis.set(keyspace.conversation(new.id), new.model_dump_json())
    await write_v1(raw_redis, [new])
    # Its delete of one and create of another: every count stays as it was.
    await raw_redis.delete(keyspace.conversation(gone.id))
    for key in (keyspace.user_conversations("jo"), keyspace.user_conversations_by_creation("jo")):
        await raw_redis.zrem(key, gone.id)
    born = AppConversationInfo(
        id=uuid.uuid4().hex,
        created_by_user_id="jo",
        sandbox_id="s-old",
        title="Yak shaving log",
        created_at=START + timedelta(seconds=4),
    )
    await raw_redis.set(keyspace.conversation(born.id), born.model_dump_json())
    await raw_redis.zadd(keyspace.user_conversations("jo"), {born.id: 0})
    await raw_redis.zadd(
        keyspace.user_conversations_by_creation("jo"), {born.id: micros(born.created_at)}
    )
    await write_v1(raw_redis, [born])
    assert await count(client, jo, title__contains="zebra") == 1
    assert await pages(client, jo, f"{BASE}/search", title__contains="yak", limit="3") == [born.id]
    assert await count(client, jo, title__contains="quarterly") == 0
    await assert_index_exact(raw_redis, "jo")


async def test_a_rebuild_indexes_a_bounded_number_of_titles_a_script(
    raw_redis: aioredis.Redis,
) -> None:
    """Review finding: a rebuild's (and the migration's) one script for 500 records held Redis
    ~330 ms where the titles were 200 characters no other title shares (198 SHA-1s and SADDs
    each). Each script now takes RETITLE_BATCH records, and the index is whole."""
    store = ConversationStore(raw_redis)
    rng = random.Random(5)
    records = [await create(store, "ann", cjk_title(rng), n) for n in range(130)]
    await raw_redis.delete(keyspace.user_conversation_titles("ann"))
    for key in await keys_of(raw_redis, keyspace.user_title_buckets("ann") + "*"):
        await raw_redis.delete(key)
    indexes = ConversationIndexes(raw_redis)
    script = indexes._retitle
    sizes: list[int] = []

    async def counted(keys: list[str], args: list[str | int]) -> object:
        sizes.append(len(args) // 4)
        return await script(keys=keys, args=args)

    indexes._retitle = counted  # type: ignore[assignment]
    await indexes.ensure("ann")
    assert sum(sizes) == len(records)
    assert max(sizes) <= indexes_module.RETITLE_BATCH < len(records)
    await assert_index_exact(raw_redis, "ann")
