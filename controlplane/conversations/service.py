"""App conversations of one user: start, list, read with live status, rename, delete, talk to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import structlog

from controlplane.agent_protocol.client import AgentClient, AgentUnavailable
from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.api.pagination import (
    HEX32,
    OFFSET,
    SCORED,
    decode_cursor,
    decode_text_cursor,
    encode_cursor,
    encode_text_cursor,
)
from controlplane.auth.models import Principal
from controlplane.conversations import task_index, workspace
from controlplane.conversations.indexes import MIN_QUERY
from controlplane.conversations.models import (
    AppConversation,
    AppConversationInfo,
    AppConversationPage,
    AppConversationStartRequest,
    AppConversationStartTask,
    AppConversationStartTaskPage,
    AppConversationUpdateRequest,
    ConversationFilters,
    ConversationSearchQuery,
    ConversationSortOrder,
    LegacyConversationQuery,
    SendMessageRequest,
    TaskFilters,
    TaskSearchQuery,
    TaskSortOrder,
)
from controlplane.conversations.pending import PendingMessages
from controlplane.conversations.starter import StartTaskRunner
from controlplane.conversations.store import (
    TITLE_SORT_CHARS,
    ConversationStore,
    title_id,
    title_member,
)
from controlplane.errors import NotFound, RuntimeUnavailable
from controlplane.ids import uuid7_hex
from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.runtime_http import RuntimeAnswer, RuntimeHttp
from controlplane.sandboxes.service import SandboxService
from controlplane.store.paging import micros

log = structlog.get_logger(__name__)


def _matches(info: AppConversationInfo, f: ConversationFilters) -> bool:
    return (
        (f.title__contains is None or f.title__contains.lower() in (info.title or "").lower())
        and (f.sandbox_id__eq is None or info.sandbox_id == f.sandbox_id__eq)
        and (f.created_at__gte is None or info.created_at >= f.created_at__gte)
        and (f.created_at__lt is None or info.created_at < f.created_at__lt)
        and (f.updated_at__gte is None or info.updated_at >= f.updated_at__gte)
        and (f.updated_at__lt is None or info.updated_at < f.updated_at__lt)
    )


_CREATED = ("created_at__gte", "created_at__lt")


def _created_bounds(f: ConversationFilters) -> tuple[int | None, int | None]:
    """The creation bounds of `f` as scores of the index by creation (None: open)."""
    return (
        micros(f.created_at__gte) if f.created_at__gte is not None else None,
        micros(f.created_at__lt) if f.created_at__lt is not None else None,
    )


def _zbounds(bounds: tuple[int | None, int | None]) -> tuple[str, str]:
    """Scores (from inclusive, to exclusive; None: open) as ZCOUNT/ZRANGE BYSCORE bounds."""
    return (
        str(bounds[0]) if bounds[0] is not None else "-inf",
        f"({bounds[1]}" if bounds[1] is not None else "+inf",
    )


def _task_matches(task: AppConversationStartTask, f: TaskFilters) -> bool:
    return (
        f.conversation_id__eq is None or task.app_conversation_id == f.conversation_id__eq
    ) and (f.created_at__gte is None or task.created_at >= f.created_at__gte)


READ_BATCH = 500
"""Most ids a page reads per round trip once its first read (limit + 1) was not filled: a
filter that few records match costs a round trip per READ_BATCH records, not per page."""

PAGE_BUDGET = 2000
"""Most records one page of a search reads: a filter no index answers (a title's contents, a
creation time) and that few records match ends its page there, with what it found (maybe
nothing) and a cursor at the last record read, so that no request reads every record of a
user; the client's next page goes on from there."""


T = TypeVar("T")


async def _filled(
    limit: int,
    after: str | None,
    ids_after: Callable[[str | None, int], Awaitable[list[str]]],
    kept: Callable[[list[str]], Awaitable[list[T]]],
    budget: int | None = None,
) -> tuple[list[T], str | None]:
    """What `kept` keeps of the ids `ids_after(after, count)` pages out in order, read until
    more than `limit` are kept or the ids end: the first read `limit + 1`, each next twice the
    last, up to READ_BATCH. With it, the last id read when `budget` ids (PAGE_BUDGET) were
    read before the page filled (the next page's position), else None."""
    found: list[T] = []
    batch = limit + 1
    read = 0
    budget = PAGE_BUDGET if budget is None else budget
    while len(found) <= limit:
        ids = await ids_after(after, batch)
        found += await kept(ids)
        read += len(ids)
        if len(ids) < batch:
            break
        after = ids[-1]
        if read >= budget and len(found) <= limit:
            return found, after
        batch = min(batch * 2, max(limit + 1, READ_BATCH))
    return found, None


def _ids_page(ids: list[str], after: str | None, count: int, desc: bool) -> list[str]:
    """Up to `count` of sorted `ids` past `after` (exclusive): older ones when desc, as
    store/paging.py pages the user's index."""
    ordered = list(reversed(ids)) if desc else ids
    if after is not None:
        ordered = [i for i in ordered if (i < after if desc else i > after)]
    return ordered[:count]


_SORT_KEYS: dict[ConversationSortOrder, tuple[Callable[[AppConversationInfo], Any], bool]] = {
    ConversationSortOrder.UPDATED_AT: (lambda c: (c.updated_at, c.id), False),
    ConversationSortOrder.UPDATED_AT_DESC: (lambda c: (c.updated_at, c.id), True),
    ConversationSortOrder.TITLE: (title_member, False),  # as the index by title orders them
    ConversationSortOrder.TITLE_DESC: (title_member, True),
}


Position = Any  # an id, a (score, id) or a title member: comparable within one order


def _position(
    query: ConversationSearchQuery,
) -> tuple[str, bool, Callable[[str | None], Position | None], Callable[[Position], str]]:
    """Which index places a record in the query's order ("id": none, its id; "update" or
    "creation": (that index's score, id); "title": its member of the index by title), whether
    the order runs highest first, and its cursor's decoding and encoding: as the order's own
    pages place and cursor it (created-at: the id, or (created_at, id) within creation bounds;
    updated-at: (updated_at, id); title: the member)."""
    order = query.sort_order
    desc = order.endswith("_DESC")

    def scored(page_id: str | None) -> tuple[int, str] | None:
        raw = decode_cursor(page_id, SCORED)
        if raw is None:
            return None
        score, _, last = raw.partition("-")
        return int(score), last

    def encode_scored(at: tuple[int, str]) -> str:
        return encode_cursor(f"{at[0]}-{at[1]}")

    if order in (ConversationSortOrder.TITLE, ConversationSortOrder.TITLE_DESC):
        return "title", desc, decode_text_cursor, encode_text_cursor
    if order in (ConversationSortOrder.UPDATED_AT, ConversationSortOrder.UPDATED_AT_DESC):
        return "update", desc, scored, encode_scored
    if _created_bounds(query) != (None, None):
        return "creation", desc, scored, encode_scored
    return "id", desc, (lambda p: decode_cursor(p, HEX32)), encode_cursor


class EventLog(Protocol):
    """The events of conversations, kept by the layer above (controlplane/events)."""

    async def delete(self, conversation_id: str) -> None:
        """Drop every event of the conversation."""


class Checkpoints(Protocol):
    """A conversation's checkpoints, kept by the layer above (controlplane/checkpoints)."""

    async def at_message(self, info: AppConversationInfo, sandbox: SandboxRecord) -> None:
        """Before a user's message goes to the agent of the RUNNING `sandbox`: a checkpoint of
        it (waited for only while its files are read, a bounded time); never raises."""

    async def dropped(self, conversation_id: str) -> None:
        """The conversation is deleted: its checkpoints go too."""


class ConversationService:
    def __init__(
        self,
        store: ConversationStore,
        events: EventLog,
        sandboxes: SandboxService,
        agent: AgentClient,
        runner: StartTaskRunner,
        *,
        publisher: LifecyclePublisher | None = None,
        pending: PendingMessages | None = None,
        runtime: RuntimeHttp | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.events = events
        self.sandboxes = sandboxes
        self.agent = agent
        self.runner = runner
        self.publisher = publisher
        self.pending = pending
        self.runtime = runtime

    # -- starting ----------------------------------------------------------------------------

    async def start(
        self, principal: Principal, request: AppConversationStartRequest
    ) -> AppConversationStartTask:
        """Save a WORKING task and run it in the background. Raises NotFound for a parent or
        sandbox that is not the caller's, ConversationIdTaken for a conversation id in use."""
        task, _updates = await self.start_watched(principal, request)
        return task

    async def start_watched(
        self, principal: Principal, request: AppConversationStartRequest
    ) -> tuple[AppConversationStartTask, asyncio.Queue[AppConversationStartTask | None]]:
        """As start(), with a queue of every later snapshot of the task (None at the end)."""
        if request.parent_conversation_id is not None:
            parent = await self.owned(principal, request.parent_conversation_id)
            request = request.model_copy(
                update={
                    k: getattr(parent, k) if getattr(request, k) is None else getattr(request, k)
                    for k in (
                        "sandbox_id",
                        "selected_repository",
                        "selected_branch",
                        "git_provider",
                        "llm_model",
                    )
                }
            )
        if request.sandbox_id is not None:
            await self.sandboxes.owned(principal, request.sandbox_id)
        if request.conversation_id is not None:
            # Ids are never a capability: an existing id is refused, whoever owns it.
            await self.store.reserve(request.conversation_id, principal.user_id)
        task = AppConversationStartTask(
            id=uuid7_hex(), created_by_user_id=principal.user_id, request=request
        )
        return task, await self.runner.submit(task, principal)

    async def task(self, principal: Principal, task_id: str) -> AppConversationStartTask | None:
        task = await self.store.get_task(task_id) if len(task_id) == 32 else None
        if task is None or (
            task.created_by_user_id != principal.user_id and not principal.is_admin
        ):
            return None
        return task

    async def batch_tasks(
        self, principal: Principal, ids: list[str]
    ) -> list[AppConversationStartTask | None]:
        tasks = await self.store.get_tasks(i.replace("-", "").lower() for i in ids)
        return [
            t if t and (t.created_by_user_id == principal.user_id or principal.is_admin) else None
            for t in tasks
        ]

    async def search_tasks(
        self, principal: Principal, query: TaskSearchQuery
    ) -> AppConversationStartTaskPage:
        """The created-at orders (the default) page the user's index of task ids (uuid7: the
        creation order) from an id cursor, the updated-at orders the user's index by update
        from a `<score>-<id>` cursor, each reading about a page of tasks; a filter by
        conversation reads that conversation's tasks alone (its own small set)."""
        order = query.sort_order
        if query.conversation_id__eq is not None:
            return await self._conversation_tasks(principal, query)
        if order in (TaskSortOrder.CREATED_AT, TaskSortOrder.CREATED_AT_DESC):
            return await self._created_tasks(principal, query)
        return await self._updated_tasks(principal, query)

    async def _conversation_tasks(
        self, principal: Principal, query: TaskSearchQuery
    ) -> AppConversationStartTaskPage:
        """A page of one conversation's tasks (its set: a task per start of it), sorted here,
        past the cursor in the query's order (an id, or `<score>-<id>`)."""
        owner, conversation = principal.user_id, query.conversation_id__eq
        assert conversation is not None
        await self.store.task_indexes.ensure(owner)
        ids = await self.store.task_indexes.of_conversation(conversation)
        tasks = [
            t
            for t in task_index.checked(await self.store.get_tasks(ids), owner, conversation)
            if _task_matches(t, query)
        ]
        desc = query.sort_order in (TaskSortOrder.CREATED_AT_DESC, TaskSortOrder.UPDATED_AT_DESC)
        by_id = query.sort_order in (TaskSortOrder.CREATED_AT, TaskSortOrder.CREATED_AT_DESC)

        def position(task: AppConversationStartTask) -> tuple[int, str]:
            return (0, task.id) if by_id else (micros(task.updated_at), task.id)

        raw = decode_cursor(query.page_id, HEX32 if by_id else SCORED)
        after: tuple[int, str] | None = None
        if raw is not None:
            score, _, last = raw.rpartition("-")
            after = (int(score) if score else 0, last)
        tasks.sort(key=position, reverse=desc)
        if after is not None:
            tasks = [t for t in tasks if (position(t) < after if desc else position(t) > after)]
        page = tasks[: query.limit]
        next_id: str | None = None
        if len(tasks) > query.limit:
            last_score, last_id = position(page[-1])
            next_id = last_id if by_id else f"{last_score}-{last_id}"
        return AppConversationStartTaskPage(
            items=page, next_page_id=encode_cursor(next_id) if next_id else None
        )

    async def _updated_tasks(
        self, principal: Principal, query: TaskSearchQuery
    ) -> AppConversationStartTaskPage:
        """A page in (updated_at, id) order from the user's index by update, past the cursor
        (`<score>-<id>`): reads pages of ids until one is filled or PAGE_BUDGET were read."""
        owner = principal.user_id
        desc = query.sort_order == TaskSortOrder.UPDATED_AT_DESC
        raw = decode_cursor(query.page_id, SCORED)
        last_score, _, last_id = (raw or "").partition("-")
        after = (int(last_score), last_id) if raw else None
        await self.store.task_indexes.ensure(owner)
        found: list[tuple[AppConversationStartTask, int]] = []
        seen: set[str] = set()
        batch, read = query.limit + 1, 0
        resume: tuple[int, str] | None = None
        while len(found) <= query.limit:
            rows = await self.store.task_indexes.page_by_update(owner, after, batch, desc)
            read += len(rows)
            tasks = await self.store.get_tasks([i for i, _ in rows])
            for task, (_, score) in zip(tasks, rows, strict=True):
                if (
                    task
                    and task.created_by_user_id == owner
                    and task.id not in seen
                    and _task_matches(task, query)
                ):
                    seen.add(task.id)  # moved past the cursor by a save mid-request
                    found.append((task, score))
            if len(rows) < batch:
                break
            after = (rows[-1][1], rows[-1][0])
            if read >= PAGE_BUDGET and len(found) <= query.limit:
                resume = after
                break
            batch = min(batch * 2, max(query.limit + 1, READ_BATCH))
        page = found[: query.limit]
        if len(found) > query.limit:
            resume = (page[-1][1], page[-1][0].id)
        return AppConversationStartTaskPage(
            items=[t for t, _ in page],
            next_page_id=encode_cursor(f"{resume[0]}-{resume[1]}") if resume else None,
        )

    async def _created_tasks(
        self, principal: Principal, query: TaskSearchQuery
    ) -> AppConversationStartTaskPage:
        """A page in id order past the cursor (an id, exclusive), read in batches that double
        from `limit + 1` up to READ_BATCH tasks until the page is filled."""
        desc = query.sort_order == TaskSortOrder.CREATED_AT_DESC
        owner = principal.user_id

        async def ids_after(after: str | None, count: int) -> list[str]:
            return await self.store.page_task_ids(owner, after, count, desc)

        async def kept(ids: list[str]) -> list[AppConversationStartTask]:
            return [t for t in await self.store.get_tasks(ids) if t and _task_matches(t, query)]

        found, resume = await _filled(
            query.limit, decode_cursor(query.page_id, HEX32), ids_after, kept
        )
        page = found[: query.limit]
        if len(found) > query.limit:
            resume = page[-1].id
        return AppConversationStartTaskPage(
            items=page, next_page_id=encode_cursor(resume) if resume else None
        )

    async def count_tasks(self, principal: Principal, filters: TaskFilters) -> int:
        """Without a filter, the size of the user's index of tasks; with `created_at__gte`
        alone, a count of their index by creation; with a conversation, that conversation's
        tasks (its own small set) that match. None reads every task of the user."""
        owner = principal.user_id
        if filters == TaskFilters():
            return await self.store.count_tasks(owner)
        await self.store.task_indexes.ensure(owner)
        if filters.conversation_id__eq is None:
            assert filters.created_at__gte is not None
            return await self.store.task_indexes.count_created_since(owner, filters.created_at__gte)
        conversation = filters.conversation_id__eq
        ids = await self.store.task_indexes.of_conversation(conversation)
        tasks = task_index.checked(await self.store.get_tasks(ids), owner, conversation)
        return sum(1 for t in tasks if _task_matches(t, filters))

    # -- reading -----------------------------------------------------------------------------

    async def owned(self, principal: Principal, conversation_id: str) -> AppConversationInfo:
        """Raises NotFound for unknown ids and for other users' conversations."""
        plain = conversation_id.replace("-", "").lower()
        info = await self.store.get(plain) if len(plain) == 32 else None
        if info is None or (
            info.created_by_user_id != principal.user_id and not principal.is_admin
        ):
            raise NotFound(f"conversation {conversation_id} not found")
        return info

    async def _live(
        self, principal: Principal, infos: list[AppConversationInfo]
    ) -> list[AppConversation]:
        records = await self.sandboxes.records(i.sandbox_id for i in infos)
        return [self._view(principal, i, r) for i, r in zip(infos, records, strict=True)]

    def _view(
        self, principal: Principal, info: AppConversationInfo, sandbox: SandboxRecord | None
    ) -> AppConversation:
        status = sandbox.status if sandbox else SandboxStatus.MISSING
        running = sandbox is not None and status == SandboxStatus.RUNNING and bool(sandbox.ports)
        execution = info.execution_status
        if status == SandboxStatus.PAUSED and execution == ExecutionStatus.RUNNING:
            execution = ExecutionStatus.PAUSED  # frozen with its sandbox
        return AppConversation(
            **info.model_dump(exclude={"execution_status"}),
            execution_status=execution,
            sandbox_status=status,
            conversation_url=f"{self.sandboxes.client_agent_url(sandbox)}/api/conversations/{info.id}"
            if running and sandbox
            else None,
            session_api_key=sandbox.session_api_key
            if running and sandbox and info.created_by_user_id == principal.user_id
            else None,
        )

    async def get(self, principal: Principal, conversation_id: str) -> AppConversation:
        return (await self._live(principal, [await self.owned(principal, conversation_id)]))[0]

    async def batch_get(self, principal: Principal, ids: list[str]) -> list[AppConversation | None]:
        infos = await self.store.get_many(i.replace("-", "").lower() for i in ids)
        visible = [
            i if i and (i.created_by_user_id == principal.user_id or principal.is_admin) else None
            for i in infos
        ]
        live = iter(await self._live(principal, [i for i in visible if i]))
        return [next(live) if i else None for i in visible]

    async def search(
        self, principal: Principal, query: ConversationSearchQuery
    ) -> AppConversationPage:
        """Newest first by default. Created-at orders page by id (within creation bounds: the
        index by creation, by (created_at, id)), updated-at orders by (updated_at, id) and
        title orders by (title, id), each reading about a page of records; a title filter of
        at least MIN_QUERY characters whose trigrams' buckets name at most PAGE_BUDGET records
        places those whose indexed title holds it by the order's index and reads about a page
        of them; a search within a sandbox's conversations (their own small set) sorts what it
        reads, with an opaque offset."""
        order = query.sort_order
        owner = principal.user_id
        in_sandbox = await self._in_sandbox(principal, query.sandbox_id__eq)
        needle = query.title__contains.lower() if query.title__contains is not None else None
        candidates: list[str] | None = None
        if in_sandbox is None and needle is not None and len(needle) >= MIN_QUERY:
            # At most PAGE_BUDGET records the title's trigrams name: read and ordered here;
            # more, and the order's index is paged with the filter (as a short query is).
            await self.store.indexes.ensure(owner)
            candidates = await self.store.indexes.title_candidates(owner, needle, PAGE_BUDGET)
        created_order = order in (
            ConversationSortOrder.CREATED_AT,
            ConversationSortOrder.CREATED_AT_DESC,
        )
        if candidates is not None:
            page, next_id = await self._candidates_page(owner, candidates, query)
        elif created_order and in_sandbox is None and _created_bounds(query) != (None, None):
            page, next_id = await self._creation_page(owner, query)
        elif created_order:
            desc = order == ConversationSortOrder.CREATED_AT_DESC
            page, next_id = await self._created_page(
                principal.user_id,
                in_sandbox,
                after=decode_cursor(query.page_id, HEX32),
                limit=query.limit,
                desc=desc,
                listed=lambda info: self._listed(info, query),
            )
        elif (
            order in (ConversationSortOrder.UPDATED_AT, ConversationSortOrder.UPDATED_AT_DESC)
            and in_sandbox is None
        ):
            page, next_id = await self._updated_page(principal.user_id, query)
        elif order in (ConversationSortOrder.TITLE, ConversationSortOrder.TITLE_DESC) and (
            in_sandbox is None
        ):
            page, next_id = await self._title_page(principal.user_id, query)
        else:
            ids = (
                in_sandbox
                if in_sandbox is not None
                else await self.store.all_ids(principal.user_id)
            )
            infos = [i for i in await self.store.get_many(ids) if i and self._listed(i, query)]
            key, reverse = _SORT_KEYS[order]
            infos.sort(key=key, reverse=reverse)
            page, next_id = _offset_page(infos, query.page_id, query.limit)
        return AppConversationPage(items=await self._live(principal, page), next_page_id=next_id)

    async def _created_page(
        self,
        owner: str | None,
        in_sandbox: list[str] | None,
        *,
        after: str | None,
        limit: int,
        desc: bool,
        listed: Callable[[AppConversationInfo], bool],
    ) -> tuple[list[AppConversationInfo], str | None]:
        """A page in creation order (ids are uuid7) past `after`, of `in_sandbox`'s ids or of
        the owner's index, and the next page's id: reads pages of ids until one is filled."""

        async def ids_after(after: str | None, count: int) -> list[str]:
            if in_sandbox is not None:
                return _ids_page(in_sandbox, after, count, desc)
            if owner is not None:
                return await self.store.page_ids(owner, after, count, desc)
            return []

        async def kept(ids: list[str]) -> list[AppConversationInfo]:
            return [
                info
                for info in await self.store.get_many(ids)
                if info
                and (in_sandbox is not None or info.created_by_user_id == owner)
                and listed(info)
            ]

        found, resume = await _filled(limit, after, ids_after, kept)
        page = found[:limit]
        if len(found) > limit:
            resume = page[-1].id
        return page, encode_cursor(resume) if resume else None

    async def _updated_page(
        self, owner: str | None, query: ConversationSearchQuery
    ) -> tuple[list[AppConversationInfo], str | None]:
        """A page in (updated_at, id) order from the owner's index by update, past the cursor
        (`<score>-<id>`), and the next page's cursor: reads pages of ids until one is filled."""
        desc = query.sort_order == ConversationSortOrder.UPDATED_AT_DESC
        if owner is None:
            return [], None
        if not await self.store.by_update_in_step(owner):
            await self.store.rebuild_by_update(owner)

        async def rows(after: tuple[int, str] | None, count: int) -> list[tuple[str, int]]:
            assert owner is not None
            return await self.store.page_by_update(owner, after, count, desc)

        return await self._scored_page(owner, query, rows)

    async def _creation_page(
        self, owner: str, query: ConversationSearchQuery
    ) -> tuple[list[AppConversationInfo], str | None]:
        """A page of a created-at order with creation bounds: the owner's index by creation
        within them, in (created_at, id) order past the cursor (`<score>-<id>`), so that a
        page reads about a page of records however many lie outside the bounds."""
        desc = query.sort_order == ConversationSortOrder.CREATED_AT_DESC
        bounds = _created_bounds(query)
        await self.store.indexes.ensure(owner)

        async def rows(after: tuple[int, str] | None, count: int) -> list[tuple[str, int]]:
            return await self.store.indexes.page_by_creation(owner, bounds, after, count, desc)

        return await self._scored_page(owner, query, rows)

    async def _scored_page(
        self,
        owner: str,
        query: ConversationSearchQuery,
        rows_after: Callable[[tuple[int, str] | None, int], Awaitable[list[tuple[str, int]]]],
    ) -> tuple[list[AppConversationInfo], str | None]:
        """A page of an index scored by time (`rows_after` pages it in the query's order) past
        the query's cursor (`<score>-<id>`), and the next page's cursor: reads pages of ids
        until one is filled or PAGE_BUDGET were read."""
        raw = decode_cursor(query.page_id, SCORED)
        last_score, _, last_id = (raw or "").partition("-")
        after = (int(last_score), last_id) if raw else None
        found: list[tuple[AppConversationInfo, int]] = []
        seen: set[str] = set()
        batch = query.limit + 1
        read = 0
        resume: tuple[int, str] | None = None
        while len(found) <= query.limit:
            rows = await rows_after(after, batch)
            read += len(rows)
            infos = await self.store.get_many([i for i, _ in rows])
            for info, (_, score) in zip(infos, rows, strict=True):
                if (
                    info
                    and info.created_by_user_id == owner
                    and info.id not in seen
                    and self._listed(info, query)
                ):
                    seen.add(info.id)  # moved past the cursor by an update mid-request
                    found.append((info, score))
            if len(rows) < batch:
                break
            after = (rows[-1][1], rows[-1][0])
            if read >= PAGE_BUDGET and len(found) <= query.limit:
                resume = after  # PAGE_BUDGET: the next page goes on from the last one read
                break
            batch = min(batch * 2, max(query.limit + 1, READ_BATCH))
        page = found[: query.limit]
        if len(found) > query.limit:
            resume = (page[-1][1], page[-1][0].id)
        return [i for i, _ in page], (encode_cursor(f"{resume[0]}-{resume[1]}") if resume else None)

    async def _candidates_page(
        self, owner: str, ids: list[str], query: ConversationSearchQuery
    ) -> tuple[list[AppConversationInfo], str | None]:
        """A page of the records of `ids` (a title's candidates, at most PAGE_BUDGET) that
        match, in the query's order past its cursor, placed and cursored as the order's own
        page would (`_position`: a later page may be read either way). They are placed from
        the order's index (one ZMSCORE or HMGET: an id and a number or title each), so that
        only about a page of records is read, in batches that grow until the page is full."""
        kind, desc, decode, encode = _position(query)
        placed = await self._placed(owner, ids, kind, query)
        placed.sort(reverse=desc)
        after = decode(query.page_id)
        if after is not None:
            placed = [p for p in placed if (p[0] < after if desc else p[0] > after)]
        found: list[tuple[AppConversationInfo, Position]] = []
        at, batch = 0, query.limit + 1
        while at < len(placed) and len(found) <= query.limit:
            rows = placed[at : at + batch]
            infos = await self.store.get_many([i for _, i in rows])
            found += [
                (info, position)
                for info, (position, _) in zip(infos, rows, strict=True)
                if info and info.created_by_user_id == owner and self._listed(info, query)
            ]
            at += len(rows)
            batch = min(batch * 2, max(query.limit + 1, READ_BATCH))
        page = found[: query.limit]
        more = len(found) > query.limit
        return [i for i, _ in page], encode(page[-1][1]) if more else None

    async def _placed(
        self, owner: str, ids: list[str], kind: str, query: ConversationSearchQuery
    ) -> list[tuple[Position, str]]:
        """(position, id) of each of `ids` the order's index holds (and, for "creation",
        within the query's bounds)."""
        if kind == "id":
            return [(i, i) for i in ids]
        if kind == "title":
            titles = await self.store.indexes.indexed_titles(owner, ids)
            return [
                (t[:TITLE_SORT_CHARS] + "\x00" + i, i)
                for i, t in zip(ids, titles, strict=True)
                if t is not None
            ]
        if kind == "update":
            if not await self.store.by_update_in_step(owner):
                await self.store.rebuild_by_update(owner)
            scores = await self.store.update_scores(owner, ids)
        else:
            scores = await self.store.indexes.creation_scores(owner, ids)
        low, high = _created_bounds(query) if kind == "creation" else (None, None)
        return [
            ((score, i), i)
            for i, score in zip(ids, scores, strict=True)
            if score is not None
            and (low is None or score >= low)
            and (high is None or score < high)
        ]

    async def _title_page(
        self, owner: str | None, query: ConversationSearchQuery
    ) -> tuple[list[AppConversationInfo], str | None]:
        """A page in (title, id) order from the owner's index by title, past the cursor (the
        last member, TEXT), and the next page's cursor: reads pages of members until one is
        filled. A member its record no longer matches (gone, renamed by a writer that did not
        know the index, saved over) is skipped and put right after the page."""
        desc = query.sort_order == ConversationSortOrder.TITLE_DESC
        after = decode_text_cursor(query.page_id)
        if owner is not None and not await self.store.by_title_in_step(owner):
            await self.store.rebuild_by_title(owner)
        found: list[tuple[AppConversationInfo, str]] = []
        stale: list[str] = []
        batch = query.limit + 1
        read = 0
        resume: str | None = None
        while owner is not None and len(found) <= query.limit:
            members = await self.store.page_by_title(owner, after, batch, desc)
            read += len(members)
            infos = await self.store.get_many([title_id(m) for m in members])
            for info, member in zip(infos, members, strict=True):
                if info is None or title_member(info) != member:
                    stale.append(member)
                elif info.created_by_user_id == owner and self._listed(info, query):
                    found.append((info, member))
            if len(members) < batch:
                break
            after = members[-1]
            if read >= PAGE_BUDGET and len(found) <= query.limit:
                resume = after  # PAGE_BUDGET: the next page goes on from the last one read
                break
            batch = min(batch * 2, max(query.limit + 1, READ_BATCH))
        if owner is not None and stale:
            await self.store.fix_by_title(owner, stale)
        page = found[: query.limit]
        if len(found) > query.limit:
            resume = page[-1][1]
        return [i for i, _ in page], encode_text_cursor(resume) if resume else None

    async def _in_sandbox(self, principal: Principal, sandbox_id: str | None) -> list[str] | None:
        """With a sandbox filter, the candidates are the conversations of that sandbox (its own
        small set), not every conversation the user has: sorted ids (uuid7: creation order),
        the caller's own only (as the user's index holds them). None without the filter."""
        if sandbox_id is None:
            return None
        ids = sorted(await self.store.ids_in_sandbox(sandbox_id))
        infos = await self.store.get_many(ids)
        return [i.id for i in infos if i is not None and i.created_by_user_id == principal.user_id]

    @staticmethod
    def _listed(info: AppConversationInfo, query: ConversationSearchQuery) -> bool:
        if info.parent_conversation_id and not query.include_sub_conversations:
            return False
        return _matches(info, query)

    async def legacy_list(
        self, principal: Principal, query: LegacyConversationQuery
    ) -> tuple[list[AppConversation], str | None]:
        """The V0 list: newest first, filtered by repository and trigger, paged by id as the
        V1 search is; the page and the next page's id (None after the last)."""

        def listed(info: AppConversationInfo) -> bool:
            return (
                (query.include_sub_conversations or not info.parent_conversation_id)
                and query.selected_repository in (None, info.selected_repository)
                and query.conversation_trigger in (None, info.trigger)
            )

        page, next_id = await self._created_page(
            principal.user_id,
            None,
            after=decode_cursor(query.page_id, HEX32),
            limit=query.limit,
            desc=True,
            listed=listed,
        )
        return await self._live(principal, page), next_id

    async def read_workspace(
        self, principal: Principal, conversation_id: str, agent_path: str, params: dict[str, str]
    ) -> RuntimeAnswer:
        """GET `agent_path` (git changes, a diff, a file) from the agent server of the caller's
        conversation's sandbox (workspace.py). Raises NotFound, Conflict (the sandbox is not
        RUNNING), SandboxUnreachable, or RuntimeUnavailable on a service built without a
        client to sandboxes."""
        info = await self.owned(principal, conversation_id)
        if self.runtime is None:
            raise RuntimeUnavailable("this control plane reads no workspaces")
        return await workspace.read(self.runtime, self.sandboxes, info, agent_path, params)

    async def count(self, principal: Principal, filters: ConversationFilters) -> int:
        """Without a filter, the size of the user's index; with time bounds of one kind alone
        (updated-at or created-at), a ZCOUNT of the user's index by update or by creation
        (none reads a record); with both, the records of the narrower range; within a
        sandbox, its conversations that match; with a title filter of at least MIN_QUERY
        characters, the records its trigrams' buckets hold in common whose indexed title
        holds it (indexes.py), of fewer, the records the index by title says may match (its
        members are read, linear in the user's conversations, a member's few bytes each).
        Records are read READ_BATCH a round trip and each checked against every filter: the
        answer is exact."""
        owner = principal.user_id
        if owner is not None and filters == ConversationFilters():
            return await self.store.count_of(owner)
        times = filters.model_copy(
            update={f: None for f in ("updated_at__gte", "updated_at__lt", *_CREATED)}
        )
        updated = filters.updated_at__gte is not None or filters.updated_at__lt is not None
        created = _created_bounds(filters)
        if owner is not None and times == ConversationFilters():
            if created == (None, None):
                if not await self.store.by_update_in_step(owner):
                    await self.store.rebuild_by_update(owner)
                return await self.store.count_by_update(
                    owner, filters.updated_at__gte, filters.updated_at__lt
                )
            await self.store.indexes.ensure(owner)
            if not updated:
                return await self.store.indexes.count_by_creation(owner, *_zbounds(created))
        ids = await self._in_sandbox(principal, filters.sandbox_id__eq)
        needle = filters.title__contains.lower() if filters.title__contains is not None else None
        if ids is None and needle is not None and len(needle) >= MIN_QUERY:
            await self.store.indexes.ensure(owner)
            ids = await self.store.indexes.title_candidates(owner, needle)
        elif ids is None and needle is not None:
            # The index by title says which records may match: only those are read.
            if not await self.store.by_title_in_step(owner):
                await self.store.rebuild_by_title(owner)
            ids = await self.store.title_candidates(owner, needle)
        if ids is None and created != (None, None):
            ids = await self._narrower_range(owner, filters)
        if ids is None:
            ids = await self.store.all_ids(owner)
        counted = 0
        for start in range(0, len(ids), READ_BATCH):
            infos = await self.store.get_many(ids[start : start + READ_BATCH])
            counted += sum(
                1 for i in infos if i and i.created_by_user_id == owner and _matches(i, filters)
            )
        return counted

    async def _narrower_range(self, owner: str, filters: ConversationFilters) -> list[str]:
        """The ids within the creation bounds or within the update bounds of `filters` (both
        set), whichever holds fewer (two ZCOUNTs, then one range read)."""
        await self.store.indexes.ensure(owner)
        if not await self.store.by_update_in_step(owner):
            await self.store.rebuild_by_update(owner)
        low, high = _zbounds(_created_bounds(filters))
        in_creation = await self.store.indexes.count_by_creation(owner, low, high)
        in_update = await self.store.count_by_update(
            owner, filters.updated_at__gte, filters.updated_at__lt
        )
        if in_creation <= in_update:
            return await self.store.indexes.ids_by_creation(owner, low, high)
        return await self.store.ids_by_update(
            owner, filters.updated_at__gte, filters.updated_at__lt
        )

    # -- changing ----------------------------------------------------------------------------

    async def rename(self, principal: Principal, conversation_id: str, title: str) -> None:
        await self.update(principal, conversation_id, AppConversationUpdateRequest(title=title))

    async def update(
        self, principal: Principal, conversation_id: str, body: AppConversationUpdateRequest
    ) -> AppConversation:
        """Change the fields the body sets (a null title or public changes nothing; a null
        repository field clears it) and answer the conversation as it is now."""
        info = await self.owned(principal, conversation_id)
        sent = body.model_fields_set
        changes = {
            name: getattr(body, name)
            for name in sent
            if getattr(body, name) is not None or name not in ("title", "public")
        }

        def change(record: AppConversationInfo) -> None:
            for name, value in changes.items():
                setattr(record, name, value)

        updated = await self.store.update(info.id, change) if changes else info
        if updated is None:
            raise NotFound(f"conversation {conversation_id} not found")
        return (await self._live(principal, [updated]))[0]

    async def delete(self, principal: Principal, conversation_id: str) -> None:
        """Delete the conversation, its events and start tasks; the sandbox too if no other
        conversation uses it."""
        info = await self.owned(principal, conversation_id)
        sandbox = await self.sandboxes.record(info.sandbox_id)
        if sandbox is not None and sandbox.status == SandboxStatus.RUNNING:
            try:
                await self.agent.delete(
                    self.sandboxes.agent_url(sandbox), sandbox.session_api_key, info.id
                )
            except (AgentUnavailable, NotFound) as exc:
                log.info("agent_delete_skipped", conversation_id=info.id, error=str(exc))
        await self.store.delete(info)
        await self.events.delete(info.id)
        if self.checkpoints is not None:
            await self.checkpoints.dropped(info.id)
        if self.pending is not None:
            await self.pending.drop(info.id)
        if self.publisher is not None and info.created_by_user_id:
            await self.publisher.publish(
                LifecycleEvent(
                    type=LifecycleType.CONVERSATION_DELETED,
                    user_id=info.created_by_user_id,
                    sandbox_id=info.sandbox_id,
                    conversation_id=info.id,
                )
            )
        if info.created_by_user_id:
            await self.store.delete_tasks_of(info.created_by_user_id, info.id)
        if sandbox is not None and not await self.store.count_in_sandbox(info.sandbox_id):
            await self.sandboxes.delete(principal, sandbox.id)

    async def _on_agent(
        self, principal: Principal, conversation_id: str
    ) -> tuple[AppConversationInfo, str, str]:
        info = await self.owned(principal, conversation_id)
        sandbox = await self.sandboxes.ensure_running(principal, info.sandbox_id)
        return info, self.sandboxes.agent_url(sandbox), sandbox.session_api_key

    async def send_message(
        self, principal: Principal, conversation_id: str, message: SendMessageRequest
    ) -> None:
        """Resume the sandbox if paused, take a checkpoint (the state before this message),
        then hand the message to the agent, after any pending messages (they were typed
        first)."""
        info = await self.owned(principal, conversation_id)
        sandbox = await self.sandboxes.ensure_running(principal, info.sandbox_id)
        if self.checkpoints is not None:
            await self.checkpoints.at_message(info, sandbox)
        if self.pending is not None:
            await self.pending.deliver(info.id, info.sandbox_id)
        base, key = self.sandboxes.agent_url(sandbox), sandbox.session_api_key
        await self.agent.send_message(base, key, info.id, message.model_dump())

    async def respond(
        self, principal: Principal, conversation_id: str, accept: bool, reason: str
    ) -> None:
        info, base, key = await self._on_agent(principal, conversation_id)
        await self.agent.respond(base, key, info.id, accept, reason)

    async def pause(self, principal: Principal, conversation_id: str) -> None:
        info, base, key = await self._on_agent(principal, conversation_id)
        await self.agent.pause(base, key, info.id)

    async def run(self, principal: Principal, conversation_id: str) -> None:
        info, base, key = await self._on_agent(principal, conversation_id)
        await self.agent.run(base, key, info.id)

    async def close(self) -> None:
        await self.runner.close()
        await asyncio.sleep(0)


def _offset_page(items: list[Any], page_id: str | None, limit: int) -> tuple[list[Any], str | None]:
    """Pages of an in-memory ordering; the cursor is an opaque offset."""
    raw = decode_cursor(page_id, OFFSET)
    start = int(raw) if raw else 0
    page = items[start : start + limit]
    more = start + limit < len(items)
    return page, encode_cursor(str(start + limit)) if more else None
