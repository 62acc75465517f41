"""Conversation records and start tasks in Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.conversations import task_index
from controlplane.conversations.indexes import (
    RETITLE_LUA,
    ConversationIndexes,
    index_by_score_lua,
    retitle_args,
    title_keys,
)
from controlplane.conversations.models import (
    TERMINAL_TASK,
    AppConversationInfo,
    AppConversationStartTask,
    now,
)
from controlplane.conversations.task_index import TaskIndexes
from controlplane.errors import Conflict
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.index_migration import as_read
from controlplane.store.paging import DROP_STRAYS, PAGE_IN_RANGE, micros, page_by_score, page_ids
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.streams import stored

log = structlog.get_logger(__name__)

BUSY = frozenset({ExecutionStatus.RUNNING})
"""Execution statuses that keep a sandbox from being paused as idle."""

# KEYS: owner key, record key. ARGV: user id. An id is free, or the caller's and not yet a
# conversation (a start that failed may be tried again with the same id); a record without an
# owner key (written before owner keys existed) is taken.
_RESERVE = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if not owner then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS: owner key, record key, user's index, sandbox's index, status set, user's index by
# update, user's index by title, user's index by creation, the user's titles hash, set of cut
# titles and bucket prefix (indexes.py). ARGV: user id, id, record JSON, update score, title
# member, creation score, indexed title, '1' when cut.
_CREATE = (
    RETITLE_LUA
    + """
local owner = redis.call('GET', KEYS[1])
if (owner and owner ~= ARGV[1]) or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[2])
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[2])
redis.call('ZADD', KEYS[6], ARGV[4], ARGV[2])
redis.call('ZADD', KEYS[7], 0, ARGV[5])
redis.call('ZADD', KEYS[8], ARGV[6], ARGV[2])
retitle(KEYS[9], KEYS[10], KEYS[11], ARGV[2], ARGV[7], ARGV[8] == '1', false)
return 1
"""
)

# Records read just before put in their owners' indexes by update (as they still are).
_INDEX_BY_UPDATE = index_by_score_lua(keyspace.USER_CONVERSATIONS_BY_UPDATE)

# KEYS: a user's index by title. ARGV: (id, updated_at as read, member found, member wanted)
# quadruples, each read from the record just before ('' where there is none). A member whose
# record is gone leaves; where the record still holds that updated_at (nothing wrote it since),
# the member found leaves unless it is the one wanted, and the one wanted is added. A record
# written since is its writer's to index, so an older read never undoes a newer write.
_FIX_BY_TITLE = (
    """
for i = 1, #ARGV, 4 do
  local id, read, found, want = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local raw = redis.call('GET', '"""
    + keyspace.conversation("")
    + """' .. id)
  if not raw then
    if found ~= '' then redis.call('ZREM', KEYS[1], found) end
  else
    local ok, record = pcall(cjson.decode, raw)
    if ok and type(record) == 'table' and read ~= '' and record['updated_at'] == read then
      if found ~= '' and found ~= want then redis.call('ZREM', KEYS[1], found) end
      if want ~= '' then redis.call('ZADD', KEYS[1], 0, want) end
    end
  end
end
return 1
"""
)

STATUS_SETS = [keyspace.conversations_in_status(None)] + [
    keyspace.conversations_in_status(s.value) for s in ExecutionStatus
]
"""Every status set of the /metrics gauge, None's first (count_by_execution_status)."""

# ARGV: conversation ids. Each id is put in the status set its record names ('-': none yet) and
# removed from every other (from all when the record is gone). A record that does not decode is
# counted as without a status: the gauge never fails on one.
_REINDEX = (
    """
local fixed = 0
local sets = {"""
    + ", ".join(f"'{key}'" for key in STATUS_SETS)
    + """}
for _, id in ipairs(ARGV) do
  local raw = redis.pcall('GET', '"""
    + keyspace.conversation("")
    + """' .. id)
  local want = nil
  if type(raw) == 'string' then
    want = sets[1]
    local ok, record = pcall(cjson.decode, raw)
    if ok and type(record) == 'table' and type(record['execution_status']) == 'string' then
      want = '"""
    + keyspace.CONVERSATIONS_IN_STATUS
    + """' .. record['execution_status']
    end
  end
  for _, key in ipairs(sets) do
    if key == want then
      fixed = fixed + redis.call('SADD', key, id)
    else
      fixed = fixed + redis.call('SREM', key, id)
    end
  end
end
return fixed
"""
)


# KEYS: a start task's lease. ARGV: owner, ttl in ms. Taken or renewed unless another holds it.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class ConversationIdTaken(Conflict):
    code = "conversation_id_taken"


class ConversationStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._reserve = redis.register_script(_RESERVE)
        self._create = redis.register_script(_CREATE)
        self._hold = redis.register_script(_HOLD)
        self._drop = redis.register_script(_DROP)
        self._reindex = redis.register_script(_REINDEX)
        self._index_by_update = redis.register_script(_INDEX_BY_UPDATE)
        self._drop_strays = redis.register_script(DROP_STRAYS)
        self._page_by_update = redis.register_script(PAGE_IN_RANGE)
        self._fix_by_title = redis.register_script(_FIX_BY_TITLE)
        self.task_indexes = TaskIndexes(redis)
        self.indexes = ConversationIndexes(redis)

    async def reserve(self, conversation_id: str, user_id: str) -> None:
        """Claim a client-chosen id for `user_id`. Raises ConversationIdTaken when it is another
        user's, or already one of this user's conversations; the message never says whose."""
        found = await self._reserve(
            keys=[
                keyspace.conversation_owner(conversation_id),
                keyspace.conversation(conversation_id),
            ],
            args=[user_id],
        )
        if not found:
            raise ConversationIdTaken(f"conversation id {conversation_id} is already in use")

    async def create(self, info: AppConversationInfo) -> None:
        """Write a new conversation and its indexes at once. Raises ConversationIdTaken when
        the id is another user's or a conversation with it exists (a concurrent start won)."""
        if info.created_by_user_id is None:
            raise ValueError("a new conversation needs its owner")
        created = await self._create(
            keys=[
                keyspace.conversation_owner(info.id),
                keyspace.conversation(info.id),
                keyspace.user_conversations(info.created_by_user_id),
                keyspace.sandbox_conversations(info.sandbox_id),
                _status_set(info.execution_status),
                keyspace.user_conversations_by_update(info.created_by_user_id),
                keyspace.user_conversations_by_title(info.created_by_user_id),
                keyspace.user_conversations_by_creation(info.created_by_user_id),
                *title_keys(info.created_by_user_id),
            ],
            args=[
                info.created_by_user_id,
                info.id,
                info.model_dump_json(),
                update_score(info.updated_at),
                title_member(info),
                micros(info.created_at),
                *retitle_args(info),
            ],
        )
        if not created:
            raise ConversationIdTaken(f"conversation id {info.id} is already in use")

    async def save(self, info: AppConversationInfo) -> None:
        """Overwrite a record and its indexes, whoever holds the id (seeding and repairs;
        new conversations go through create())."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keyspace.conversation(info.id), info.model_dump_json())
            if info.created_by_user_id is not None:
                pipe.zadd(keyspace.user_conversations(info.created_by_user_id), {info.id: 0})
                pipe.zadd(
                    keyspace.user_conversations_by_update(info.created_by_user_id),
                    {info.id: update_score(info.updated_at)},
                )
                # The record it overwrites may have had another title: that member stays until
                # a title search finds it (`fix_by_title`).
                pipe.zadd(
                    keyspace.user_conversations_by_title(info.created_by_user_id),
                    {title_member(info): 0},
                )
                self.indexes.queue_write(pipe, info)
            pipe.sadd(keyspace.sandbox_conversations(info.sandbox_id), info.id)
            # Whatever status the record it overwrites had: in that set only.
            wanted = _status_set(info.execution_status)
            for status_set in STATUS_SETS:
                if status_set == wanted:
                    pipe.sadd(status_set, info.id)
                else:
                    pipe.srem(status_set, info.id)
            await pipe.execute()

    async def get(self, conversation_id: str) -> AppConversationInfo | None:
        raw = await self._redis.get(keyspace.conversation(conversation_id))
        return AppConversationInfo.model_validate_json(text(raw)) if raw else None

    async def get_many(self, ids: Iterable[str]) -> list[AppConversationInfo | None]:
        ids = list(ids)
        if not ids:
            return []
        rows = await self._redis.mget([keyspace.conversation(i) for i in ids])
        return [AppConversationInfo.model_validate_json(text(r)) if r else None for r in rows]

    async def update(
        self, conversation_id: str, change: Callable[[AppConversationInfo], None]
    ) -> AppConversationInfo | None:
        """Apply `change` atomically (optimistic lock); None when the record does not exist."""
        key = keyspace.conversation(conversation_id)
        entry = audit.route_entry(AuditAction.CONVERSATION_UPDATE)
        for _ in range(20):
            async with self._redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return None
                    info = AppConversationInfo.model_validate_json(text(raw))
                    before, titled = info.execution_status, title_member(info)
                    change(info)
                    info.updated_at = now()
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.set(key, info.model_dump_json())
                    _move_status(pipe, conversation_id, before, info.execution_status)
                    if info.created_by_user_id is not None:
                        pipe.zadd(
                            keyspace.user_conversations_by_update(info.created_by_user_id),
                            {conversation_id: update_score(info.updated_at)},
                        )
                        by_title = keyspace.user_conversations_by_title(info.created_by_user_id)
                        if title_member(info) != titled:
                            pipe.zrem(by_title, titled)
                        pipe.zadd(by_title, {title_member(info): 0})
                        self.indexes.queue_write(pipe, info)
                    if entry is not None:
                        entry.queue(pipe)
                    await pipe.execute()
                    stored(entry)
                    return info
                except WatchError:
                    continue
        raise Conflict(f"conversation {conversation_id} changed concurrently too often; retry")

    async def delete(self, info: AppConversationInfo) -> None:
        entry = audit.route_entry(AuditAction.CONVERSATION_DELETE, sandbox_id=info.sandbox_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keyspace.conversation(info.id))
            if info.created_by_user_id is not None:
                pipe.zrem(keyspace.user_conversations(info.created_by_user_id), info.id)
                pipe.zrem(keyspace.user_conversations_by_update(info.created_by_user_id), info.id)
                # `info` may be older than the record: a member of another title stays until a
                # title search finds its record gone (`fix_by_title`).
                pipe.zrem(
                    keyspace.user_conversations_by_title(info.created_by_user_id),
                    title_member(info),
                )
                self.indexes.queue_delete(pipe, info)
            pipe.srem(keyspace.sandbox_conversations(info.sandbox_id), info.id)
            for status_set in STATUS_SETS:  # `info` may be older than the record: every set
                pipe.srem(status_set, info.id)
            if entry is not None:
                entry.queue(pipe)
            await pipe.execute()
        stored(entry)

    async def reindex_statuses(self) -> int:
        """Put every record in the status set it names and in no other, and drop from the sets
        the ids whose record is gone; put every record in its user's index by update; returns
        how many status memberships were wrong. Walks every record (SCAN) and every set (SSCAN)
        in pages, each page one atomic script: safe beside any write. Run once at each start of
        a replica (conversations_ctx), which builds the sets and indexes of a deployment
        upgraded from a version without them and puts right what such a version's writers
        left once the last of them is gone (a user's index by update is also put right by the
        first updated-at search that finds it out of step: `by_update_in_step`)."""
        fixed = 0
        batch: list[str] = []
        prefix = keyspace.conversation("")
        async for key in self._redis.scan_iter(match=prefix + "*", count=COUNT_PAGE):
            conversation_id = text(key).removeprefix(prefix)
            if ":" in conversation_id:
                continue  # a key below a conversation's (its checkpoints), not a record
            batch.append(conversation_id)
            if len(batch) >= COUNT_PAGE:
                fixed += await self._reindex_page(batch)
                batch = []
        if batch:
            fixed += await self._reindex_page(batch)
        for status_set in STATUS_SETS:
            cursor = 0
            while True:
                cursor, raw = await self._redis.sscan(status_set, cursor, count=COUNT_PAGE)
                if raw:
                    fixed += int(await self._reindex(args=[text(i) for i in raw]))
                if not cursor:
                    break
        return fixed

    async def _reindex_page(self, ids: list[str]) -> int:
        fixed = int(await self._reindex(args=ids))
        await self._index_records(ids)
        return fixed

    async def _index_records(self, ids: list[str]) -> None:
        """Put the records of `ids` in their owners' indexes by update, as they are now."""
        rows = await self._redis.mget([keyspace.conversation(i) for i in ids])
        args: list[str | int] = []
        for row in rows:
            read = as_read(row, AppConversationInfo)
            if read is None:
                continue
            info, stored_at = read
            if info.created_by_user_id is not None:
                args += [info.id, info.created_by_user_id, update_score(info.updated_at), stored_at]
        if args:
            await self._index_by_update(args=args)

    async def by_update_in_step(self, owner: str) -> bool:
        """Whether the owner's index by update holds as many ids as their index: every writer
        of this version keeps both in one script or transaction; a difference is a writer that
        did not know it (an older replica during a rolling upgrade, a restored backup)."""
        return await self._as_many_as_ids(owner, keyspace.user_conversations_by_update(owner))

    async def _as_many_as_ids(self, owner: str, index: str) -> bool:
        """Whether `index` holds as many members as the owner's index holds ids."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keyspace.user_conversations(owner))
            pipe.zcard(index)
            ids, indexed = await pipe.execute()
        return bool(ids == indexed)

    async def rebuild_by_update(self, owner: str) -> None:
        """Put every record of the owner in their index by update and drop the ids whose
        record is gone (once, when `by_update_in_step` says it is out of step)."""
        ids = await self.all_ids(owner)
        for start in range(0, len(ids), COUNT_PAGE):
            await self._index_records(ids[start : start + COUNT_PAGE])
        await self._drop_strays(
            keys=[keyspace.user_conversations(owner), keyspace.user_conversations_by_update(owner)]
        )
        log.info("conversation_update_index_rebuilt", user_id=owner, conversations=len(ids))

    async def page_by_update(
        self, owner: str, after: tuple[int, str] | None, count: int, desc: bool
    ) -> list[tuple[str, int]]:
        """Up to `count` (id, update score) of the owner's conversations past `after` (a
        score and id, exclusive) in (updated_at, id) order: newest first when desc."""
        key = keyspace.user_conversations_by_update(owner)
        return await page_by_score(
            self._redis, self._page_by_update, key, after, count=count, desc=desc
        )

    async def by_title_in_step(self, owner: str) -> bool:
        """Whether the owner's index by title holds as many members as their index holds ids
        (as `by_update_in_step`): a difference is a writer that did not know it, or a member
        left by a save or a delete of an older copy of the record."""
        return await self._as_many_as_ids(owner, keyspace.user_conversations_by_title(owner))

    async def rebuild_by_title(self, owner: str) -> None:
        """Every record of the owner given its member in their index by title, then every
        member that is not its record's current one dropped (once, when `by_title_in_step`
        says the index is out of step)."""
        key = keyspace.user_conversations_by_title(owner)
        known: dict[str, tuple[str, str]] = {}  # id: (updated_at as read, member wanted)
        ids = await self.all_ids(owner)
        for start in range(0, len(ids), COUNT_PAGE):
            fixes = await self._title_fixes(
                owner, [(i, "") for i in ids[start : start + COUNT_PAGE]]
            )
            known.update((i, (read, want)) for i, read, _, want in fixes)
            await self._fix_by_title(keys=[key], args=[v for row in fixes for v in row])
        # Every other member goes, judged by the records as just read (the script skips one
        # written since); a member of an id not read goes only if its record is gone.
        strays: list[str] = []
        for raw in await self._redis.zrange(key, 0, -1):
            member = text(raw)
            read, want = known.get(title_id(member), ("", ""))
            if member != want:
                strays += [title_id(member), read, member, want]
        step = 4 * COUNT_PAGE
        for start in range(0, len(strays), step):
            await self._fix_by_title(keys=[key], args=strays[start : start + step])
        log.info("conversation_title_index_rebuilt", user_id=owner, conversations=len(ids))

    async def fix_by_title(self, owner: str, members: list[str]) -> None:
        """Members of the owner's index by title that a page found out of date (their record
        gone, or under another title now): dropped, and each record's current member added."""
        fixes = await self._title_fixes(owner, [(title_id(m), m) for m in members])
        if fixes:
            await self._fix_by_title(
                keys=[keyspace.user_conversations_by_title(owner)],
                args=[v for row in fixes for v in row],
            )

    async def _title_fixes(
        self, owner: str, found: list[tuple[str, str]]
    ) -> list[tuple[str, str, str, str]]:
        """(id, updated_at as read, member found, member wanted) of each (id, member found),
        from the records as they are now: the wanted member only for a record of `owner` that
        decodes ('' otherwise: a found member is then dropped only if its record is gone)."""
        if not found:
            return []
        rows = await self._redis.mget([keyspace.conversation(i) for i, _ in found])
        fixes: list[tuple[str, str, str, str]] = []
        for (conversation_id, member), row in zip(found, rows, strict=True):
            read = as_read(row, AppConversationInfo)
            if read is not None and read[0].created_by_user_id == owner:
                fixes.append((conversation_id, read[1], member, title_member(read[0])))
            else:
                fixes.append((conversation_id, "", member, ""))
        return fixes

    async def page_by_title(
        self, owner: str, after: str | None, count: int, desc: bool
    ) -> list[str]:
        """Up to `count` members of the owner's index by title past `after` (a member,
        exclusive) in lexical order, i.e. (title, id): the last first when desc."""
        # From the cursor (exclusive) on, towards the end the order runs to; REV takes its range
        # as (max, min).
        start = "(" + after if after is not None else ("+" if desc else "-")
        end = "-" if desc else "+"
        raw: Any = await self._redis.zrange(
            keyspace.user_conversations_by_title(owner),
            start,
            end,
            desc=desc,
            bylex=True,
            offset=0,
            num=count,
        )
        return [text(m) for m in raw]

    async def title_candidates(self, owner: str, needle: str) -> list[str]:
        """The ids of the owner's conversations whose title may contain `needle` (any case),
        judged from their index by title alone: a member whose title part holds it, and one
        whose title part is cut (TITLE_SORT_CHARS long: the rest is only in the record). The
        members are read TITLE_SCAN a round trip; no record is. Linear in the user's
        conversations still, at a member's few bytes each instead of a record's JSON."""
        key = keyspace.user_conversations_by_title(owner)
        needle = needle.lower()
        found: list[str] = []
        after: str | None = None
        while True:
            raw: Any = await self._redis.zrange(
                key,
                "(" + after if after is not None else "-",
                "+",
                bylex=True,
                offset=0,
                num=TITLE_SCAN,
            )
            members = [text(m) for m in raw]
            for member in members:
                title, _, conversation_id = member.rpartition("\x00")
                if needle in title or len(title) >= TITLE_SORT_CHARS:
                    found.append(conversation_id)
            if len(members) < TITLE_SCAN:
                return list(dict.fromkeys(found))  # an id under two titles (one stale): once
            after = members[-1]

    async def count_by_update(self, owner: str, gte: datetime | None, lt: datetime | None) -> int:
        """How many of the owner's conversations were last updated in [gte, lt) (None: open),
        from their index by update: one ZCOUNT, whatever their number."""
        low = str(update_score(gte)) if gte is not None else "-inf"
        high = f"({update_score(lt)}" if lt is not None else "+inf"
        return int(
            await self._redis.zcount(keyspace.user_conversations_by_update(owner), low, high)
        )

    async def ids_by_update(
        self, owner: str, gte: datetime | None, lt: datetime | None
    ) -> list[str]:
        """Every id of the owner's conversations last updated in [gte, lt) (None: open)."""
        low = str(update_score(gte)) if gte is not None else "-inf"
        high = f"({update_score(lt)}" if lt is not None else "+inf"
        key = keyspace.user_conversations_by_update(owner)
        return [text(i) for i in await self._redis.zrange(key, low, high, byscore=True)]

    async def update_scores(self, owner: str, ids: list[str]) -> list[int | None]:
        """Each id's score in the owner's index by update (None: not in it): one ZMSCORE."""
        if not ids:
            return []
        key = keyspace.user_conversations_by_update(owner)
        scores = await self._redis.zmscore(key, ids)
        return [int(s) if s is not None else None for s in scores]

    async def count_of(self, owner: str) -> int:
        """How many conversations the owner has (their index's size)."""
        return int(await self._redis.zcard(keyspace.user_conversations(owner)))

    async def page_ids(self, owner: str, after: str | None, count: int, desc: bool) -> list[str]:
        return await page_ids(
            self._redis, keyspace.user_conversations(owner), after, count, desc=desc
        )

    async def all_ids(self, owner: str) -> list[str]:
        raw = await self._redis.zrange(keyspace.user_conversations(owner), 0, -1)
        return [text(i) for i in raw]

    async def busy(self, sandbox_id: str) -> bool:
        """True while a conversation in the sandbox has its agent running (the idle reaper's
        question, controlplane/sandboxes/reaper.py: Activity)."""
        infos = await self.get_many(sorted(await self.ids_in_sandbox(sandbox_id)))
        return any(i is not None and i.execution_status in BUSY for i in infos)

    async def count_in_sandbox(self, sandbox_id: str) -> int:
        """How many conversations live in the sandbox (its set's size: no member read)."""
        return int(await self._redis.scard(keyspace.sandbox_conversations(sandbox_id)))

    async def ids_in_sandbox(self, sandbox_id: str) -> set[str]:
        return {
            text(i) for i in await self._redis.smembers(keyspace.sandbox_conversations(sandbox_id))
        }

    # -- start tasks -------------------------------------------------------------------------

    async def save_task(
        self, task: AppConversationStartTask, *, lease: tuple[str, float] | None = None
    ) -> None:
        """`lease`: (owner, ttl) of a new task's lease, written with it, so that no replica
        takes the task for one whose replica died before it first renewed its lease."""
        task.updated_at = now()
        # A start's entry with its task's first save (later saves are the task's own steps).
        entry = audit.route_entry(AuditAction.CONVERSATION_START, task_id=task.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            if entry is not None:
                entry.queue(pipe)
            pipe.set(keyspace.start_task(task.id), task.model_dump_json())
            if lease is not None:
                pipe.set(keyspace.start_task_lease(task.id), lease[0], px=int(lease[1] * 1000))
            if task.created_by_user_id is not None:
                pipe.zadd(keyspace.user_start_tasks(task.created_by_user_id), {task.id: 0})
            task_index.queue_save(pipe, task)
            if task.status in TERMINAL_TASK:
                pipe.srem(keyspace.ACTIVE_START_TASKS, task.id)
            else:
                pipe.sadd(keyspace.ACTIVE_START_TASKS, task.id)
            await pipe.execute()
        stored(entry)

    async def get_task(self, task_id: str) -> AppConversationStartTask | None:
        raw = await self._redis.get(keyspace.start_task(task_id))
        return AppConversationStartTask.model_validate_json(text(raw)) if raw else None

    async def get_tasks(self, ids: Iterable[str]) -> list[AppConversationStartTask | None]:
        ids = list(ids)
        if not ids:
            return []
        rows = await self._redis.mget([keyspace.start_task(i) for i in ids])
        return [AppConversationStartTask.model_validate_json(text(r)) if r else None for r in rows]

    async def page_task_ids(
        self, owner: str, after: str | None, count: int, desc: bool
    ) -> list[str]:
        return await page_ids(
            self._redis, keyspace.user_start_tasks(owner), after, count, desc=desc
        )

    async def count_tasks(self, owner: str) -> int:
        """How many start tasks the owner has (their index's size)."""
        return int(await self._redis.zcard(keyspace.user_start_tasks(owner)))

    async def all_task_ids(self, owner: str) -> list[str]:
        return [text(i) for i in await self._redis.zrange(keyspace.user_start_tasks(owner), 0, -1)]

    async def hold_lease(self, task_id: str, owner: str, ttl: float) -> bool:
        """Take or renew a start task's lease for `owner`; False when another replica holds it
        (this one's lapsed and it was taken over)."""
        held = await self._hold(
            keys=[keyspace.start_task_lease(task_id)], args=[owner, int(ttl * 1000)]
        )
        return bool(held)

    async def drop_lease(self, task_id: str, owner: str) -> None:
        """Release the lease if `owner` still holds it."""
        await self._drop(keys=[keyspace.start_task_lease(task_id)], args=[owner])

    async def leased(self, task_ids: list[str]) -> list[bool]:
        if not task_ids:
            return []
        rows = await self._redis.mget([keyspace.start_task_lease(i) for i in task_ids])
        return [row is not None for row in rows]

    async def active_task_ids(self) -> list[str]:
        return sorted(text(i) for i in await self._redis.smembers(keyspace.ACTIVE_START_TASKS))

    async def delete_tasks_of(self, owner: str, conversation_id: str) -> None:
        """Remove the start tasks that produced a conversation (with the conversation): those
        its set of tasks names, each checked against its task."""
        await self.task_indexes.ensure(owner)
        ids = await self.task_indexes.of_conversation(conversation_id)
        tasks = task_index.checked(await self.get_tasks(ids), owner, conversation_id)
        doomed = [t.id for t in tasks]
        async with self._redis.pipeline(transaction=True) as pipe:
            if doomed:
                pipe.delete(*[keyspace.start_task(i) for i in doomed])
                pipe.zrem(keyspace.user_start_tasks(owner), *doomed)
                pipe.srem(keyspace.ACTIVE_START_TASKS, *doomed)
            task_index.queue_delete(pipe, owner, conversation_id, doomed)
            await pipe.execute()


TITLE_SCAN = 2000
"""Members of an index by title read per round trip by `title_candidates`."""

TITLE_SORT_CHARS = 64
"""Characters of a lowercased title its member in the index by title holds: titles alike in
those are in id (creation) order, and a page's cursor, which holds a member, stays short."""


def title_member(info: AppConversationInfo) -> str:
    """The conversation's member in its owner's index by title: its lowercased title's first
    TITLE_SORT_CHARS characters, NUL, its id. Lexical order (UTF-8 bytes, i.e. code points) is
    (title, id) order."""
    return (info.title or "").lower()[:TITLE_SORT_CHARS] + "\x00" + info.id


def title_id(member: str) -> str:
    """The conversation id a member of an index by title ends with."""
    return member.rpartition("\x00")[2]


def update_score(updated_at: datetime) -> int:
    """A record's `updated_at` as its score in the user's index by update (store/paging.py
    `micros`)."""
    return micros(updated_at)


def _status_set(status: ExecutionStatus | None) -> str:
    return keyspace.conversations_in_status(status.value if status is not None else None)


def _move_status(
    pipe: Pipeline,
    conversation_id: str,
    before: ExecutionStatus | None,
    after: ExecutionStatus | None,
) -> None:
    """Queue the gauge's set change of a record written in `pipe`'s transaction. The new set is
    always added to: a record written before the sets existed joins them at its next write."""
    if before != after:
        pipe.srem(_status_set(before), conversation_id)
    pipe.sadd(_status_set(after), conversation_id)


COUNT_PAGE = 500
"""Records read per Redis round trip by reindex_statuses."""


async def count_by_execution_status(redis: aioredis.Redis) -> dict[str | None, int]:
    """Every conversation by the execution status its agent last reported (None: none yet), for
    the /metrics gauge: the size of each status set, one round trip whatever the number of
    conversations. Every write of a record changes its set in the same transaction or script
    (create, save, update, delete); `ConversationStore.reindex_statuses` builds and repairs them."""
    async with redis.pipeline(transaction=False) as pipe:
        for status_set in STATUS_SETS:
            pipe.scard(status_set)
        sizes = await pipe.execute()
    statuses: list[str | None] = [None, *(s.value for s in ExecutionStatus)]
    return {status: int(n) for status, n in zip(statuses, sizes, strict=True) if n}


REINDEX_RETRY = 15.0
"""Seconds between tries of a start's re-index that Redis interrupted."""


async def reindex_in_background(store: ConversationStore, retry: float = REINDEX_RETRY) -> None:
    """`store.reindex_statuses()` until it has run through once (every replica runs it at its
    start, conversations_ctx); a failed try is logged and tried again."""
    while True:
        try:
            fixed = await store.reindex_statuses()
        except REDIS_DOWN as exc:
            log.warning("conversation_status_sets_interrupted", error=str(exc))
        except Exception:
            log.exception("conversation_status_sets_failed")  # a read-only replica, or a bug
        else:
            if fixed:
                log.info("conversation_status_sets_repaired", memberships=fixed)
            return
        await asyncio.sleep(retry)
