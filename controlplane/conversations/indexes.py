"""The last per-user indexes of conversations (issue 30), that spare a count or a search reading
every record of a user:

- by creation (`user_conversations_by_creation`, scored by `created_at`): a count from a
  creation time is one ZCOUNT, and the created-at orders within creation bounds page it
  (client-chosen ids say nothing of when a conversation was made);
- by the trigrams of titles (`user_title_buckets`: a set of ids per bucket of trigrams of a
  lowercased title, a bucket being the first BUCKET_DIGITS hex digits of the trigram's SHA-1,
  with `user_conversation_titles`, the title each id is indexed under, and `user_cut_titles`,
  the ids whose title is longer than the index holds): a title search of at least three
  characters intersects its trigrams' buckets, smallest first, keeps the ids whose indexed
  title holds the query (their titles read from the hash) and checks each candidate's record,
  so the answer is exact. Buckets, not a key per trigram: a user holds at most 4,096 keys of
  the index whatever the titles (a key per trigram let titles of trigrams no other title holds
  cost ~50 KB a conversation).

Each is written in the script or transaction that writes the record (`queue_write`,
`queue_delete`; the create script of store.py runs RETITLE_LUA itself). Records written before
the indexes existed, or indexed by trigram by `conversation-indexes-v1`, are put in them once per
deployment in the background (`migrate`, `conversation-indexes-v2` in `acs:migrations`, under a
lock; each owner's keys of v1 removed, `drop_v1`), and a user's are put right by the first
request that finds them out of step with the user's index of ids (`ensure`): a record written by
an older replica during a rolling upgrade (whose v1 keys that request removes too).
"""

from __future__ import annotations

import hashlib

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline

from controlplane.conversations.models import AppConversationInfo
from controlplane.store import keyspace, text
from controlplane.store.index_migration import IndexMigration, as_read, retried
from controlplane.store.paging import DROP_STRAYS, PAGE_IN_RANGE, micros, page_by_score

log = structlog.get_logger(__name__)

NAME = "conversation-indexes-v2"
"""This migration's name in `acs:migrations`."""
BATCH = 500
"""Records read per round trip by a rebuild (the migration's batches: store/index_migration.py)."""
RETRY = 15.0
"""Seconds between tries of a migration that Redis interrupted."""
DROP_BATCH = 50
"""Ids of the v1 titles hash whose trigram keys one script takes them out of (at most 198 SREMs
each: ~10,000 commands, a few milliseconds of Redis, a script)."""
RETITLE_BATCH = 50
"""Records one rebuild's or the migration's _RETITLE script indexes (each up to 198 SHA-1s and
SADDs): at BATCH records a script, 500 titles of 200 characters no other title shares held
Redis ~330 ms (review, 2 loaded cores); at 50, a tenth of it."""

FILTER_BATCH = 500
"""Titles read a command by `holding` (one pipeline)."""
SAMPLE = 200
"""Candidates whose titles `holding` reads first, of more: how many lack the query."""
STRANGERS = 0.15
"""The share of a sample lacking the query from which every candidate's title is read: a title
costs ~2 us of Redis and ~1 of Python, a record read for nothing ~3 and ~15 (bench/
title_index.py, the count's MGETs), so reading every title pays from ~17 % of strangers. A
common query's candidates are few strangers (a bucket adds its ~n x t / 4,096 to thousands)."""

BUCKET_DIGITS = 3
"""Hex digits of a trigram's SHA-1 that name its bucket: 16**3 = 4,096 keys a user at most.
A 3-character query's bucket holds, beside its own, the conversations of every other trigram in
it: about (the user's memberships) / 4,096, i.e. n x t / 4,096 for n titles of t trigrams each
(~400 at 10,000 titles of 165), dropped on their indexed title (`holding`) before any record is
read. More digits: fewer of them, up to 16 times the keys."""

TRIGRAM_CHARS = 200
"""Characters of a lowercased title the trigram index holds: every title the API writes is at
most 200 characters (start, rename, PATCH; a first message's title is 50), so a title has at
most 198 trigrams. A longer lowercased title (a record written another way, or one whose
lowercase is longer, as "İ" becomes two characters) is indexed by its first TRIGRAM_CHARS and
named in the user's set of cut titles, a candidate of every search, checked on its record."""

MIN_QUERY = 3
"""Characters (lowercased) a title query needs to be answered by the trigram index; a shorter
one has no trigram and reads the user's index by title (store.py `title_candidates`)."""

# The trigrams of a title: a character is a UTF-8 sequence (a lead byte and its continuation
# bytes), as Python's are code points: both cut a title into the same trigrams.
GRAMS_LUA = r"""
local function grams(s)
  local chars, out = {}, {}
  for c in string.gmatch(s, "[%z\1-\127\194-\244][\128-\191]*") do chars[#chars + 1] = c end
  for i = 1, #chars - 2 do out[chars[i] .. chars[i + 1] .. chars[i + 2]] = true end
  return out
end
"""

# The trigram index's change of one conversation, inlined in the scripts that write records.
# retitle(hash, cut, prefix, id, title or false, long, force): the buckets of the title the
# hash holds for `id` that the new title (false: the conversation is gone) lacks are taken out,
# the new ones put in (all of them when `force`: a rebuild), the hash and the set of cut
# titles set. A bucket is the first BUCKET_DIGITS hex digits of the SHA-1 of a trigram's UTF-8
# bytes (Python's `bucket`). A write that keeps the indexed title (most writes: a status, the
# metrics) touches no bucket.
RETITLE_LUA = (
    GRAMS_LUA
    + """
local function buckets(s)
  local out = {}
  for g in pairs(grams(s)) do out[string.sub(redis.sha1hex(g), 1, """
    + str(BUCKET_DIGITS)
    + """)] = true end
  return out
end
local function retitle(hash, cut, prefix, id, title, long, force)
  local old = redis.call('HGET', hash, id)
  if title and not force and old == title then
    if long then redis.call('SADD', cut, id) else redis.call('SREM', cut, id) end
    return
  end
  local before, after = {}, {}
  if title then after = buckets(title) end
  if old == title then before = after elseif old then before = buckets(old) end
  for b in pairs(before) do
    if not after[b] then redis.call('SREM', prefix .. b, id) end
  end
  for b in pairs(after) do
    if force or not before[b] then redis.call('SADD', prefix .. b, id) end
  end
  if title then
    redis.call('HSET', hash, id, title)
    if long then redis.call('SADD', cut, id) else redis.call('SREM', cut, id) end
  else
    redis.call('HDEL', hash, id)
    redis.call('SREM', cut, id)
  end
end
"""
)

# KEYS: the user's titles hash, set of cut titles, bucket prefix. ARGV: (id, title, '1' when
# cut ('-': the id is taken out), guard) quadruples. Guard '': none (the caller's transaction
# writes the record); '!': only if the record is gone; else the record's `updated_at` as read:
# only if the record still holds it (a rebuild's and the migration's read), so that an older
# read never undoes a newer write (whose writer indexed it).
_RETITLE = (
    RETITLE_LUA
    + """
local done = 0
for i = 1, #ARGV, 4 do
  local id, title, long, guard = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local go = true
  if guard ~= '' then
    local raw = redis.call('GET', '"""
    + keyspace.conversation("")
    + """' .. id)
    if guard == '!' then
      go = not raw
    elseif not raw then
      go = false
    else
      local ok, record = pcall(cjson.decode, raw)
      go = ok and type(record) == 'table' and record['updated_at'] == guard
    end
  end
  if go then
    if long == '-' then title = false end
    retitle(KEYS[1], KEYS[2], KEYS[3], id, title, long == '1', guard ~= '')
    done = done + 1
  end
end
return done
"""
)


# ARGV: (id, owner, creation score, updated_at as read) quadruples, read from the records just
# before: each id whose record still holds that updated_at gets that score in its owner's index
# by creation (a record written or deleted since is its writer's to index).
def index_by_score_lua(index: tuple[str, str]) -> str:
    """The script that puts records read just before in one of their owners' indexes scored by
    time (`index`: keyspace's name around the owner). ARGV: (id, owner, score, updated_at as
    read) quadruples. Each id whose record still holds that updated_at gets that score; a record
    written since (its writer set its score) or deleted since (its delete took it out) is left
    alone, so an older read never undoes a newer write."""
    return (
        """
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  local raw = redis.call('GET', '"""
        + keyspace.conversation("")
        + """' .. id)
  if raw then
    local ok, record = pcall(cjson.decode, raw)
    if ok and type(record) == 'table' and record['updated_at'] == ARGV[i + 3] then
      redis.call('ZADD', '"""
        + index[0]
        + """' .. ARGV[i + 1] .. '"""
        + index[1]
        + """', ARGV[i + 2], id)
    end
  end
end
return 1
"""
    )


_INDEX_BY_CREATION = index_by_score_lua(keyspace.USER_CONVERSATIONS_BY_CREATION)


_DROP = "-"
"""The cut argument of _RETITLE that takes an id out."""

# KEYS: a user's v1 titles hash, v1 trigram prefix, the user's titles hash (v2). ARGV: ids.
# Each id the v1 hash holds is taken out of its title's trigram sets and the hash (a set or the
# hash left empty is gone): v1's writers kept each id's sets to its title in the hash, so nothing
# of it is left, and an older replica's v1 write between two scripts is whole in both (taken out
# by a later call). Returns the ids taken out whose v1 title is not the one v2 holds: an older
# replica wrote them (a rename, or a create while another was deleted: the counts `ensure`
# compares stay in step), so the caller indexes their records again.
_DROP_V1 = (
    GRAMS_LUA
    + """
local stale = {}
for _, id in ipairs(ARGV) do
  local title = redis.call('HGET', KEYS[1], id)
  if title then
    for g in pairs(grams(title)) do redis.call('SREM', KEYS[2] .. g, id) end
    redis.call('HDEL', KEYS[1], id)
    if redis.call('HGET', KEYS[3], id) ~= title then stale[#stale + 1] = id end
  end
end
return stale
"""
)


def indexed_title(info: AppConversationInfo) -> tuple[str, bool]:
    """The title the trigram index holds for `info` (lowercased, at most TRIGRAM_CHARS
    characters) and whether the lowercased title is longer."""
    lowered = (info.title or "").lower()
    return lowered[:TRIGRAM_CHARS], len(lowered) > TRIGRAM_CHARS


def trigrams(lowered: str) -> set[str]:
    """Every three consecutive characters of an already lowercased string."""
    return {lowered[i : i + 3] for i in range(len(lowered) - 2)}


def bucket(gram: str) -> str:
    """The bucket of a trigram: the first BUCKET_DIGITS hex digits of the SHA-1 of its UTF-8
    bytes, as RETITLE_LUA's `redis.sha1hex` names it (an even spread, not a secret)."""
    digest = hashlib.sha1(gram.encode(), usedforsecurity=False).hexdigest()
    return digest[:BUCKET_DIGITS]


def buckets(lowered: str) -> set[str]:
    """The buckets of the trigrams of an already lowercased string."""
    return {bucket(g) for g in trigrams(lowered)}


def title_keys(owner: str) -> list[str]:
    """KEYS of _RETITLE (and of the create script's retitle) for the owner."""
    return [
        keyspace.user_conversation_titles(owner),
        keyspace.user_cut_titles(owner),
        keyspace.user_title_buckets(owner),
    ]


def retitle_args(info: AppConversationInfo) -> list[str]:
    """(title, '1' when cut) of `info` as the create script's retitle takes them."""
    title, cut = indexed_title(info)
    return [title, "1" if cut else "0"]


class ConversationIndexes:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._retitle = redis.register_script(_RETITLE)
        self._drop_v1 = redis.register_script(_DROP_V1)
        self._index_by_creation = redis.register_script(_INDEX_BY_CREATION)
        self._drop_strays = redis.register_script(DROP_STRAYS)
        self._page = redis.register_script(PAGE_IN_RANGE)

    # -- writes, in the writer's transaction -------------------------------------------------

    def queue_write(self, pipe: Pipeline, info: AppConversationInfo) -> None:
        """Queue the index writes of `info` written in `pipe`'s transaction. The script goes
        as EVAL, its text, never EVALSHA: a script Redis does not know would fail at EXEC,
        after the record's write applied."""
        owner = info.created_by_user_id
        if owner is None:
            return
        by_creation = keyspace.user_conversations_by_creation(owner)
        pipe.zadd(by_creation, {info.id: micros(info.created_at)})
        title, cut = indexed_title(info)
        pipe.eval(_RETITLE, 3, *title_keys(owner), info.id, title, int(cut), "")

    def queue_delete(self, pipe: Pipeline, info: AppConversationInfo) -> None:
        """Queue the index writes of the deletion of `info`'s conversation (the trigrams taken
        out are those of the title the index holds, whatever copy `info` is)."""
        owner = info.created_by_user_id
        if owner is None:
            return
        pipe.zrem(keyspace.user_conversations_by_creation(owner), info.id)
        pipe.eval(_RETITLE, 3, *title_keys(owner), info.id, "", _DROP, "")

    # -- reads -------------------------------------------------------------------------------

    async def count_by_creation(self, owner: str, low: str, high: str) -> int:
        """How many of the owner's conversations were created within the ZCOUNT bounds."""
        key = keyspace.user_conversations_by_creation(owner)
        return int(await self._redis.zcount(key, low, high))

    async def page_by_creation(
        self,
        owner: str,
        bounds: tuple[int | None, int | None],
        after: tuple[int, str] | None,
        count: int,
        desc: bool,
    ) -> list[tuple[str, int]]:
        """Up to `count` (id, creation score) of the owner's conversations created within
        `bounds` (scores: from inclusive, to exclusive; None: open) past `after` (a score and
        id, exclusive) in (created_at, id) order: the newest first when desc."""
        low = str(bounds[0]) if bounds[0] is not None else "-inf"
        high = f"({bounds[1]}" if bounds[1] is not None else "+inf"
        key = keyspace.user_conversations_by_creation(owner)
        return await page_by_score(
            self._redis, self._page, key, after, count=count, desc=desc, low=low, high=high
        )

    async def ids_by_creation(self, owner: str, low: str, high: str) -> list[str]:
        """Every id of the owner's conversations created within the ZRANGE BYSCORE bounds."""
        key = keyspace.user_conversations_by_creation(owner)
        return [text(i) for i in await self._redis.zrange(key, low, high, byscore=True)]

    async def creation_scores(self, owner: str, ids: list[str]) -> list[int | None]:
        """Each id's score in the owner's index by creation (None: not in it): one ZMSCORE."""
        if not ids:
            return []
        key = keyspace.user_conversations_by_creation(owner)
        scores = await self._redis.zmscore(key, ids)
        return [int(s) if s is not None else None for s in scores]

    async def indexed_titles(self, owner: str, ids: list[str]) -> list[str | None]:
        """Each id's title as the owner's trigram index holds it (None: not in it): one HMGET."""
        if not ids:
            return []
        rows = await self._redis.hmget(keyspace.user_conversation_titles(owner), ids)
        return [text(r) if r is not None else None for r in rows]

    async def title_candidates(
        self, owner: str, needle: str, most: int | None = None
    ) -> list[str] | None:
        """The ids of the owner's conversations whose title may contain `needle` (lowercased,
        at least MIN_QUERY characters): those in every bucket of its trigrams (SINTER, which
        walks the smallest set and looks each id up in the others) whose indexed title holds
        it (`holding`), and those whose title the index cut. None when the buckets and the
        cut titles hold more than `most` (the caller reads its order's index instead):
        SINTERCARD stops counting there."""
        prefix = keyspace.user_title_buckets(owner)
        keys = [prefix + b for b in sorted(buckets(needle))]
        cut = keyspace.user_cut_titles(owner)
        if most is not None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.execute_command("SINTERCARD", len(keys), *keys, "LIMIT", most + 1)
                pipe.scard(cut)
                inter, cut_count = await pipe.execute()
            if int(inter) + int(cut_count) > most:
                return None
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.sinter(keys)
            pipe.smembers(cut)
            found, cut_ids = await pipe.execute()
        held = await self.holding(owner, sorted({text(i) for i in found}), needle)
        return sorted(set(held) | {text(i) for i in cut_ids})

    async def holding(self, owner: str, ids: list[str], needle: str) -> list[str]:
        """Those of `ids` whose title in the owner's titles hash holds `needle` (an id the hash
        lacks is kept: its record decides), where that is worth reading their titles: the ids
        a bucket shares with the query only by their trigrams' hash dropped, no record read.
        Of more than SAMPLE ids, SAMPLE spread over them are checked first; when fewer than
        STRANGERS of those lack the query, the rest are kept unread (their records, read next,
        cost less than every title would)."""
        if len(ids) > SAMPLE:
            step = len(ids) / SAMPLE
            sample = [ids[int(n * step)] for n in range(SAMPLE)]
            kept = await self._titles_hold(owner, sample, needle)
            if len(sample) - len(kept) < STRANGERS * len(sample):
                dropped = set(sample).difference(kept)
                return [i for i in ids if i not in dropped]
        return await self._titles_hold(owner, ids, needle)

    async def _titles_hold(self, owner: str, ids: list[str], needle: str) -> list[str]:
        """Those of `ids` whose indexed title holds `needle`, or that the hash lacks: one round
        trip (HMGET, FILTER_BATCH ids a command), checked here. In Python, not in a script: a
        script doing it held Redis ~2 us an id (22 ms for 9,500, bench/title_index.py)."""
        if not ids:
            return []
        key = keyspace.user_conversation_titles(owner)
        async with self._redis.pipeline(transaction=False) as pipe:
            for start in range(0, len(ids), FILTER_BATCH):
                pipe.hmget(key, ids[start : start + FILTER_BATCH])
            rows = await pipe.execute()
        titles = [title for row in rows for title in row]
        return [i for i, t in zip(ids, titles, strict=True) if t is None or needle in text(t)]

    # -- putting them right ------------------------------------------------------------------

    async def ensure(self, owner: str) -> None:
        """Rebuild the owner's indexes that hold another number of conversations than the
        owner's index of ids (one round trip when they are in step, as every writer of this
        version keeps them); first remove the owner's keys of v1, where an older replica wrote
        some (the same round trip says so)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keyspace.user_conversations(owner))
            pipe.zcard(keyspace.user_conversations_by_creation(owner))
            pipe.hlen(keyspace.user_conversation_titles(owner))
            pipe.exists(keyspace.user_conversation_titles_v1(owner))
            listed, by_creation, titled, v1 = await pipe.execute()
        if v1:
            await self.drop_v1(owner)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zcard(keyspace.user_conversations(owner))
                pipe.zcard(keyspace.user_conversations_by_creation(owner))
                pipe.hlen(keyspace.user_conversation_titles(owner))
                listed, by_creation, titled = await pipe.execute()
        if listed == by_creation == titled:
            return
        raw = await self._redis.zrange(keyspace.user_conversations(owner), 0, -1)
        ids = [text(i) for i in raw]
        for start in range(0, len(ids), BATCH):
            await self.index(ids[start : start + BATCH], owner)
        await self._drop_strays(
            keys=[
                keyspace.user_conversations(owner),
                keyspace.user_conversations_by_creation(owner),
            ]
        )
        # Titles of ids the user's index no longer holds: out, if their record is gone.
        listed_ids = set(ids)
        strays = [
            text(i)
            for i in await self._redis.hkeys(keyspace.user_conversation_titles(owner))
            if text(i) not in listed_ids
        ]
        for start in range(0, len(strays), RETITLE_BATCH):
            args: list[str | int] = []
            for conversation_id in strays[start : start + RETITLE_BATCH]:
                args += [conversation_id, "", _DROP, "!"]
            await self._retitle(keys=title_keys(owner), args=args)
        log.info("conversation_indexes_rebuilt", user_id=owner, conversations=len(ids))

    async def index(self, ids: list[str], owner: str | None = None) -> set[str]:
        """Put the records of `ids` (the owner's only, when named) in their indexes as they
        are now; each write is skipped where the record was written since it was read. The
        owners of the records indexed."""
        if not ids:
            return set()
        rows = await self._redis.mget([keyspace.conversation(i) for i in ids])
        by_creation: list[str | int] = []
        titles: dict[str, list[str | int]] = {}
        for row in rows:
            read = as_read(row, AppConversationInfo)
            if read is None:
                continue
            info, stored_at = read
            user = info.created_by_user_id
            if user is None or (owner is not None and user != owner):
                continue
            by_creation += [info.id, user, micros(info.created_at), stored_at]
            title, cut = indexed_title(info)
            titles.setdefault(user, []).extend([info.id, title, int(cut), stored_at])
        if by_creation:
            await self._index_by_creation(args=by_creation)
        for user, args in titles.items():
            for start in range(0, len(args), 4 * RETITLE_BATCH):
                await self._retitle(
                    keys=title_keys(user), args=args[start : start + 4 * RETITLE_BATCH]
                )
        return set(titles)

    async def drop_v1(self, owner: str) -> list[str]:
        """Remove the owner's trigram index of `conversation-indexes-v1` (a set per trigram
        and the titles hash whose titles name them), DROP_BATCH ids a script, and index again
        the records of the ids whose v1 title is not the one this index holds (an older
        replica wrote them since this index did); those ids. An older replica still writing v1
        during an upgrade adds to it again: `ensure` calls this whenever the hash is there."""
        hash_key = keyspace.user_conversation_titles_v1(owner)
        keys = [hash_key, keyspace.user_title_trigrams_v1(owner), title_keys(owner)[0]]
        stale: list[str] = []
        batch: list[str] = []
        async for field, _ in self._redis.hscan_iter(hash_key, count=DROP_BATCH):
            batch.append(text(field))
            if len(batch) >= DROP_BATCH:
                stale += [text(i) for i in await self._drop_v1(keys=keys, args=batch)]
                batch = []
        if batch:
            stale += [text(i) for i in await self._drop_v1(keys=keys, args=batch)]
        # Read after the drop: a record an older replica writes from here on is in v1 again.
        for start in range(0, len(stale), BATCH):
            await self.index(stale[start : start + BATCH], owner)
        log.info("conversation_trigrams_v1_dropped", user_id=owner, reindexed=len(stale))
        return stale

    async def migrate(self) -> bool:
        """Every stored record in its indexes, and each of their owners' v1 trigram keys
        removed, once per deployment, by one replica at a time (the others go on at once:
        `ensure` covers a user's records until this is done); safe to run again and beside
        any write. True when this call applied it."""
        owners: set[str] = set()

        async def index_noting_owners(ids: list[str]) -> None:
            owners.update(await self.index(ids))

        applied = await IndexMigration(
            NAME, keyspace.conversation(""), index_noting_owners, "conversations", skip_nested=True
        ).run(self._redis)
        # After the walk, not at an owner's first record: a v1 title then differs from this
        # index's only where an older replica wrote since the walk read that record (the ids
        # `drop_v1` indexes again), not for every record the walk has yet to reach.
        for owner in sorted(owners):
            await self.drop_v1(owner)
        return applied


async def migrate_in_background(indexes: ConversationIndexes, retry: float = RETRY) -> None:
    """`indexes.migrate()` until it has run through or another replica has (every replica
    starts it, conversations_ctx); a failed try is logged and tried again."""
    await retried(indexes.migrate, "conversation_indexes", retry)
