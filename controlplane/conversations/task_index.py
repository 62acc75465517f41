"""The indexes of start tasks that spare a request reading every task of a user (issue 30):

- the user's tasks by update (`user_start_tasks_by_update`): the updated-at orders' pages;
- the user's tasks by creation (`user_start_tasks_by_creation`): a count from a time;
- a conversation's tasks (`conversation_start_tasks`): its delete, a filter by conversation.

Each is written in the transaction that writes the task (`queue_save`, `queue_delete`). Tasks
written before the indexes existed are put in them once per deployment at a replica's start
(`migrate`, `start-task-indexes-v1` in `acs:migrations`), and a user's are put right by the
first request that finds the user's indexes out of step with the user's list of tasks (a task
saved by an older replica during a rolling upgrade): `TaskIndexes.ensure`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline

from controlplane.conversations.models import AppConversationStartTask
from controlplane.store import keyspace, text
from controlplane.store.index_migration import IndexMigration, as_read, retried
from controlplane.store.paging import DROP_STRAYS, PAGE_IN_RANGE, micros, page_by_score

log = structlog.get_logger(__name__)

NAME = "start-task-indexes-v1"
"""This migration's name in `acs:migrations`."""
BATCH = 500
"""Tasks read per round trip by a rebuild (the migration's batches: store/index_migration.py)."""
RETRY = 15.0
"""Seconds between tries of a migration that Redis interrupted."""

# ARGV: (id, owner, update score, creation score, updated_at as read, conversation id or '')
# sextuples read from the tasks just before. Each task that still holds that updated_at gets
# its scores in its owner's indexes and its id in its conversation's set; a task saved since
# (its save indexed it) or deleted since (its delete took it out) is left alone, so an older
# read never undoes a newer write.
_INDEX = (
    """
for i = 1, #ARGV, 6 do
  local id = ARGV[i]
  local raw = redis.call('GET', '"""
    + keyspace.start_task("")
    + """' .. id)
  if raw then
    local ok, task = pcall(cjson.decode, raw)
    if ok and type(task) == 'table' and task['updated_at'] == ARGV[i + 4] then
      local user = ARGV[i + 1]
      redis.call('ZADD', '"""
    + keyspace.USER_START_TASKS_BY_UPDATE[0]
    + """' .. user .. '"""
    + keyspace.USER_START_TASKS_BY_UPDATE[1]
    + """', ARGV[i + 2], id)
      redis.call('ZADD', '"""
    + keyspace.USER_START_TASKS_BY_CREATION[0]
    + """' .. user .. '"""
    + keyspace.USER_START_TASKS_BY_CREATION[1]
    + """', ARGV[i + 3], id)
      if ARGV[i + 5] ~= '' then
        redis.call('SADD', '"""
    + keyspace.CONVERSATION_START_TASKS
    + """' .. ARGV[i + 5], id)
      end
    end
  end
end
return 1
"""
)


def queue_save(pipe: Pipeline, task: AppConversationStartTask) -> None:
    """Queue the index writes of a task saved in `pipe`'s transaction."""
    if task.created_by_user_id is not None:
        owner = task.created_by_user_id
        pipe.zadd(keyspace.user_start_tasks_by_update(owner), {task.id: micros(task.updated_at)})
        pipe.zadd(keyspace.user_start_tasks_by_creation(owner), {task.id: micros(task.created_at)})
    if task.app_conversation_id is not None:
        pipe.sadd(keyspace.conversation_start_tasks(task.app_conversation_id), task.id)


def queue_delete(pipe: Pipeline, owner: str, conversation_id: str, ids: list[str]) -> None:
    """Queue the index writes of the deletion of a conversation's tasks `ids`."""
    if ids:
        pipe.zrem(keyspace.user_start_tasks_by_update(owner), *ids)
        pipe.zrem(keyspace.user_start_tasks_by_creation(owner), *ids)
    pipe.delete(keyspace.conversation_start_tasks(conversation_id))


class TaskIndexes:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._index = redis.register_script(_INDEX)
        self._drop_strays = redis.register_script(DROP_STRAYS)
        self._page = redis.register_script(PAGE_IN_RANGE)

    async def ensure(self, owner: str) -> None:
        """Put the owner's indexes right if they hold another number of tasks than the owner's
        list of tasks (one round trip when they are in step, as every writer of this version
        keeps them)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keyspace.user_start_tasks(owner))
            pipe.zcard(keyspace.user_start_tasks_by_update(owner))
            pipe.zcard(keyspace.user_start_tasks_by_creation(owner))
            listed, by_update, by_creation = await pipe.execute()
        if listed == by_update == by_creation:
            return
        raw = await self._redis.zrange(keyspace.user_start_tasks(owner), 0, -1)
        ids = [text(i) for i in raw]
        for start in range(0, len(ids), BATCH):
            await self.index(ids[start : start + BATCH])
        await self._drop_strays(
            keys=[
                keyspace.user_start_tasks(owner),
                keyspace.user_start_tasks_by_update(owner),
                keyspace.user_start_tasks_by_creation(owner),
            ]
        )
        log.info("start_task_indexes_rebuilt", user_id=owner, tasks=len(ids))

    async def index(self, ids: list[str]) -> None:
        """Put the tasks of `ids` in their indexes, as they are now."""
        if not ids:
            return
        rows = await self._redis.mget([keyspace.start_task(i) for i in ids])
        args: list[str | int] = []
        for row in rows:
            read = as_read(row, AppConversationStartTask)
            if read is None:
                continue
            task, stored_at = read
            owner = task.created_by_user_id
            if owner is None:
                continue
            args += [
                task.id,
                owner,
                micros(task.updated_at),
                micros(task.created_at),
                stored_at,
                task.app_conversation_id or "",
            ]
        if args:
            await self._index(args=args)

    async def page_by_update(
        self, owner: str, after: tuple[int, str] | None, count: int, desc: bool
    ) -> list[tuple[str, int]]:
        """Up to `count` (id, update score) of the owner's tasks past `after` (a score and id,
        exclusive) in (updated_at, id) order: the newest first when desc."""
        key = keyspace.user_start_tasks_by_update(owner)
        return await page_by_score(self._redis, self._page, key, after, count=count, desc=desc)

    async def count_created_since(self, owner: str, since: datetime) -> int:
        """How many of the owner's tasks were created at or after `since`: one ZCOUNT."""
        key = keyspace.user_start_tasks_by_creation(owner)
        return int(await self._redis.zcount(key, micros(since), "+inf"))

    async def of_conversation(self, conversation_id: str) -> list[str]:
        """The ids the conversation's set holds (each to be checked against its task)."""
        raw = await self._redis.smembers(keyspace.conversation_start_tasks(conversation_id))
        return sorted(text(i) for i in raw)

    async def migrate(self) -> bool:
        """Every stored task in its indexes, once per deployment, by one replica at a time
        (the others go on at once: `ensure` covers a user's tasks until this is done); safe
        to run again and beside any write. True when this call applied it."""
        return await IndexMigration(
            NAME, keyspace.start_task(""), self.index, "tasks", skip_nested=False
        ).run(self._redis)


async def migrate_in_background(indexes: TaskIndexes, retry: float = RETRY) -> None:
    """`indexes.migrate()` until it has run through or another replica has (every replica
    starts it, conversations_ctx); a failed try is logged and tried again."""
    await retried(indexes.migrate, "start_task_indexes", retry)


def checked(
    tasks: Iterable[AppConversationStartTask | None], owner: str, conversation_id: str
) -> list[AppConversationStartTask]:
    """The tasks of a conversation's set that are still the owner's and that conversation's."""
    return [
        t
        for t in tasks
        if t is not None
        and t.created_by_user_id == owner
        and t.app_conversation_id == conversation_id
    ]
