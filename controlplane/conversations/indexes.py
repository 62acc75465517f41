"""The last per-user indexes of conversations (issue 30), that spare a count or a search reading
every record of a user:

- by creation (`user_conversations_by_creation`, scored by `created_at`): a count from a
  creation time is one ZCOUNT, and the created-at orders within creation bounds page it
  (client-chosen ids say nothing of when a conversation was made);
- by the trigrams of titles (`user_title_trigrams`: a set of ids per trigram of a lowercased
  title, with `user_conversation_titles`, the title each id is indexed under, and
  `user_cut_titles`, the ids whose title is longer than the index holds): a title search of at
  least three characters intersects its trigrams' sets, smallest first, and checks each
  candidate's record, so the answer is exact.

Each is written in the script or transaction that writes the record (`queue_write`,
`queue_delete`; the create script of store.py runs RETITLE_LUA itself). Records written before
the indexes existed are put in them once per deployment in the background (`migrate`,
`conversation-indexes-v1` in `acs:migrations`, under a lock), and a user's are put right by the
first request that finds them out of step with the user's index of ids (`ensure`): a record
written by an older replica during a rolling upgrade.
"""

from __future__ import annotations

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline

from controlplane.conversations.models import AppConversationInfo
from controlplane.store import keyspace, text
from controlplane.store.index_migration import IndexMigration, as_read, retried
from controlplane.store.paging import DROP_STRAYS, PAGE_IN_RANGE, micros, page_by_score

log = structlog.get_logger(__name__)

NAME = "conversation-indexes-v1"
"""This migration's name in `acs:migrations`."""
BATCH = 500
"""Records read per round trip by a rebuild (the migration's batches: store/index_migration.py)."""
RETRY = 15.0
"""Seconds between tries of a migration that Redis interrupted."""

TRIGRAM_CHARS = 200
"""Characters of a lowercased title the trigram index holds: every title the API writes is at
most 200 characters (start, rename, PATCH; a first message's title is 50), so a title has at
most 198 trigrams. A longer lowercased title (a record written another way, or one whose
lowercase is longer, as "İ" becomes two characters) is indexed by its first TRIGRAM_CHARS and
named in the user's set of cut titles, a candidate of every search, checked on its record."""

MIN_QUERY = 3
"""Characters (lowercased) a title query needs to be answered by the trigram index; a shorter
one has no trigram and reads the user's index by title (store.py `title_candidates`)."""

# The trigram index's change of one conversation, inlined in the scripts that write records.
# retitle(hash, cut, prefix, id, title or false, long, force): the trigrams of the title the
# hash holds for `id` that the new title (false: the conversation is gone) lacks are taken out,
# the new ones put in (all of them when `force`: a rebuild), the hash and the set of cut
# titles set. A character is a UTF-8 sequence (a lead byte and its continuation bytes), as
# Python's are code points: both cut a title into the same trigrams.
RETITLE_LUA = r"""
local function grams(s)
  local chars, out = {}, {}
  for c in string.gmatch(s, "[%z\1-\127\194-\244][\128-\191]*") do chars[#chars + 1] = c end
  for i = 1, #chars - 2 do out[chars[i] .. chars[i + 1] .. chars[i + 2]] = true end
  return out
end
local function retitle(hash, cut, prefix, id, title, long, force)
  local old = redis.call('HGET', hash, id)
  local before, after = {}, {}
  if old then before = grams(old) end
  if title then after = grams(title) end
  for g in pairs(before) do
    if not after[g] then redis.call('SREM', prefix .. g, id) end
  end
  for g in pairs(after) do
    if force or not before[g] then redis.call('SADD', prefix .. g, id) end
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

# KEYS: the user's titles hash, set of cut titles, trigram prefix. ARGV: (id, title, '1' when
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


def indexed_title(info: AppConversationInfo) -> tuple[str, bool]:
    """The title the trigram index holds for `info` (lowercased, at most TRIGRAM_CHARS
    characters) and whether the lowercased title is longer."""
    lowered = (info.title or "").lower()
    return lowered[:TRIGRAM_CHARS], len(lowered) > TRIGRAM_CHARS


def trigrams(lowered: str) -> set[str]:
    """Every three consecutive characters of an already lowercased string."""
    return {lowered[i : i + 3] for i in range(len(lowered) - 2)}


def title_keys(owner: str) -> list[str]:
    """KEYS of _RETITLE (and of the create script's retitle) for the owner."""
    return [
        keyspace.user_conversation_titles(owner),
        keyspace.user_cut_titles(owner),
        keyspace.user_title_trigrams(owner),
    ]


def retitle_args(info: AppConversationInfo) -> list[str]:
    """(title, '1' when cut) of `info` as the create script's retitle takes them."""
    title, cut = indexed_title(info)
    return [title, "1" if cut else "0"]


class ConversationIndexes:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._retitle = redis.register_script(_RETITLE)
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
        at least MIN_QUERY characters): those in every set of its trigrams (SINTER, which
        walks the smallest set and looks each id up in the others) and those whose title the
        index cut. None when more than `most` would be (the caller reads its order's index
        instead): SINTERCARD stops counting there."""
        keys = [keyspace.user_title_trigrams(owner) + g for g in sorted(trigrams(needle))]
        if most is not None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.execute_command("SINTERCARD", len(keys), *keys, "LIMIT", most + 1)
                pipe.scard(keyspace.user_cut_titles(owner))
                inter, cut = await pipe.execute()
            if int(inter) + int(cut) > most:
                return None
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.sinter(keys)
            pipe.smembers(keyspace.user_cut_titles(owner))
            found, cut_ids = await pipe.execute()
        return sorted({text(i) for i in found} | {text(i) for i in cut_ids})

    # -- putting them right ------------------------------------------------------------------

    async def ensure(self, owner: str) -> None:
        """Rebuild the owner's indexes that hold another number of conversations than the
        owner's index of ids (one round trip when they are in step, as every writer of this
        version keeps them)."""
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
        for start in range(0, len(strays), BATCH):
            args: list[str | int] = []
            for conversation_id in strays[start : start + BATCH]:
                args += [conversation_id, "", _DROP, "!"]
            await self._retitle(keys=title_keys(owner), args=args)
        log.info("conversation_indexes_rebuilt", user_id=owner, conversations=len(ids))

    async def index(self, ids: list[str], owner: str | None = None) -> None:
        """Put the records of `ids` (the owner's only, when named) in their indexes as they
        are now; each write is skipped where the record was written since it was read."""
        if not ids:
            return
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
            await self._retitle(keys=title_keys(user), args=args)

    async def migrate(self) -> bool:
        """Every stored record in its indexes, once per deployment, by one replica at a time
        (the others go on at once: `ensure` covers a user's records until this is done); safe
        to run again and beside any write. True when this call applied it."""
        return await IndexMigration(
            NAME, keyspace.conversation(""), self.index, "conversations", skip_nested=True
        ).run(self._redis)


async def migrate_in_background(indexes: ConversationIndexes, retry: float = RETRY) -> None:
    """`indexes.migrate()` until it has run through or another replica has (every replica
    starts it, conversations_ctx); a failed try is logged and tried again."""
    await retried(indexes.migrate, "conversation_indexes", retry)
