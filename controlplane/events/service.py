"""Events in, from sandbox webhooks; events out, to searches and live sockets."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import redis.asyncio as aioredis
import structlog

from controlplane.agent_protocol.client import AgentClient
from controlplane.agent_protocol.models import ExecutionStatus, MetricsSnapshot
from controlplane.agent_protocol.state import readable_metrics, readable_state, status_in
from controlplane.api.pagination import STREAM_ID, decode_cursor, encode_cursor
from controlplane.api.ratelimit import RateLimiter, webhook_refusal
from controlplane.auth.models import Principal
from controlplane.auth.tickets import Ticket, TicketService
from controlplane.conversations.models import HEX_ID, AppConversationInfo
from controlplane.conversations.service import ConversationService
from controlplane.conversations.store import ConversationStore
from controlplane.conversations.titles import name_from_first_message
from controlplane.errors import NotFound, SandboxNotFound, Unauthorized
from controlplane.events.budget import ENFORCED_BY_AGENT, BudgetEnforcer, crossed
from controlplane.events.fanout import Fanout, Subscription
from controlplane.events.models import (
    Event,
    EventFilters,
    EventPage,
    EventSearchQuery,
    EventSortOrder,
)
from controlplane.events.store import EventStore, StoredEvent
from controlplane.sandboxes.models import SandboxRecord
from controlplane.sandboxes.reads import MAX_SESSION_KEY, SandboxReads
from controlplane.specs.catalog import SpecCatalog

log = structlog.get_logger(__name__)

TOUCH_EVERY = 1.0
"""Seconds between two touches of a sandbox's activity by the event webhook (per replica)."""
TOUCHED_KEPT = 10_000


class FeedStart(NamedTuple):
    """Where a live socket starts: its conversation, and the stream id after which it reads."""

    conversation_id: str
    after: str


def _utc(value: datetime) -> datetime:
    """Agents write naive UTC timestamps (as the SDK does in a container); some add an offset."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _event_time(event: dict[str, Any]) -> datetime | None:
    try:
        return _utc(datetime.fromisoformat(str(event.get("timestamp", ""))))
    except ValueError:
        return None


def _snapshot(event: dict[str, Any]) -> bool:
    """A ``full_state`` update: the official server posts one when its webhook subscribes and
    when it closes, but keeps none in its event log (our agent sends them only to sockets).
    Its status and cost are read; it is not stored, so the stream is the agent's history."""
    return event.get("kind") == "ConversationStateUpdateEvent" and event.get("key") == "full_state"


def _matches(event: dict[str, Any], f: EventFilters) -> bool:
    if f.kind__eq is not None and event.get("kind") != f.kind__eq.value:
        return False
    if f.timestamp__gte is None and f.timestamp__lt is None:
        return True
    when = _event_time(event)
    if when is None:
        return False
    return (f.timestamp__gte is None or when >= _utc(f.timestamp__gte)) and (
        f.timestamp__lt is None or when < _utc(f.timestamp__lt)
    )


class EventService:
    def __init__(
        self,
        store: EventStore,
        conversations: ConversationService,
        *,
        records: ConversationStore,
        sandboxes: SandboxReads,
        catalog: SpecCatalog,
        agent: AgentClient,
        url_host: str,
        reader: aioredis.Redis,
        tickets: TicketService,
        on_lag: Callable[[float], None] | None = None,
    ) -> None:
        """`records`: the conversation records webhooks update; `url_host`: where agent servers'
        published ports are reached (ACS_URL_HOST); `reader`: the client live sockets block on
        (a connection of its own per read); `tickets`: the WebSocket tickets it mints.
        `on_lag(seconds)` is told, for each event of a stored webhook batch, how long after its
        timestamp it arrived (the event lag metric)."""
        self.store = store
        self.fanout = Fanout(store, reader, self._exists)
        self._tickets = tickets
        self._conversations = conversations
        self._records = records
        self._sandboxes = sandboxes
        self._catalog = catalog
        self._url_host = url_host
        self._on_lag = on_lag
        self._budget = BudgetEnforcer(agent, store)
        self._touched: dict[str, float] = {}  # sandbox id: when this replica last touched it

    async def _exists(self, conversation_id: str) -> bool:
        return await self._records.get(conversation_id) is not None

    async def close(self) -> None:
        await self.fanout.close()
        await self._budget.close()

    # -- webhooks ----------------------------------------------------------------------------

    async def _sandbox(self, sandbox_id: str, key: str | None) -> SandboxRecord:
        """The sandbox whose session key was presented. Raises Unauthorized."""
        record = await self._sandboxes.by_session_key(key, sandbox_id)
        if record is None:
            raise Unauthorized("invalid sandbox session key")
        return record

    async def _conversation(
        self, sandbox_id: str, conversation_id: str
    ) -> AppConversationInfo | None:
        """The conversation, if the control plane started it in this sandbox. Others (created
        on the agent server directly by an SDK client, or already deleted) are acknowledged and
        not kept: agent servers retry refused posts for minutes (the official one even holds a
        conversation's delete until they succeed), and there is no one to keep them for."""
        plain = conversation_id.replace("-", "").lower()
        # Not an id's shape (the path's segment as sent): it could name another key, a hash.
        info = await self._records.get(plain) if re.fullmatch(HEX_ID, plain) else None
        if info is None or info.sandbox_id != sandbox_id:
            self._unknown(sandbox_id, conversation_id)
            return None
        return info

    @staticmethod
    def _unknown(sandbox_id: str, conversation_id: str) -> None:
        log.info(
            "webhook_conversation_unknown", sandbox_id=sandbox_id, conversation=conversation_id
        )

    async def ingest(
        self,
        sandbox_id: str,
        key: str | None,
        conversation_id: str,
        events: list[tuple[Event, dict[str, Any]]],
        *,
        verified: bool = False,
        limiter: RateLimiter | None = None,
    ) -> int:
        """Append a batch, each event stored as the agent sent it (duplicates skipped), and note
        the status and cost it reports. Returns how many events were new.

        `verified`: the webhook middleware has checked `key` against `sandbox_id` and counted
        the request against `ACS_WEBHOOK_RATE_LIMIT_PER_MINUTE` already. Otherwise the key is
        checked (Unauthorized), the request counted against `limiter` (QuotaExceeded), the
        conversation read and the events appended in one Redis round trip (EventStore.ingest).
        Either way the sandbox's record is read only when the batch reports a state (most do
        not)."""
        raw = [event for _checked, event in events]
        status, metrics = readable_state(raw)  # before storing: a 422 stores nothing
        plain = conversation_id.replace("-", "").lower()
        kept = [e for e in raw if not _snapshot(e)]
        if verified:
            info = await self._conversation(sandbox_id, conversation_id)
            if info is None:
                return 0
            added = await self.store.append(info.id, kept)
            await self._touch(sandbox_id)
        else:
            if not key or len(key) > MAX_SESSION_KEY:
                raise Unauthorized("invalid sandbox session key")
            due = self._touch_due(sandbox_id, time.monotonic())
            found = await self.store.ingest(
                sandbox_id,
                key,
                plain,
                kept,
                limit=limiter.per_minute if limiter is not None else None,
                touch_at=datetime.now(UTC).isoformat() if due is not None else None,
            )
            if found.refused == "key":
                raise Unauthorized("invalid sandbox session key")
            if found.refused == "rate":
                assert limiter is not None  # counted only with a limit
                raise webhook_refusal(limiter.decision(found.rate))
            if found.refused:
                self._unknown(sandbox_id, conversation_id)
                return 0
            if due is not None:
                self._touched[sandbox_id] = due
            info = AppConversationInfo.model_validate_json(found.record)
            added = found.added
        await name_from_first_message(self._records, info, raw)
        if self._on_lag is not None:
            now = datetime.now(UTC)
            for checked, _event in events:
                self._on_lag((now - _utc(checked.timestamp)).total_seconds())
        if status is not None or metrics is not None:
            sandbox = await self._sandboxes.record(sandbox_id)
            if sandbox is not None:  # None: deleted since the key was checked, nothing to note
                await self._note_state(sandbox, info.id, status, metrics)
        return added

    def _touch_due(self, sandbox_id: str, now: float) -> float | None:
        """`now` when this replica should touch the sandbox's activity (at most once a
        TOUCH_EVERY seconds per sandbox: an agent posting many batches a second is as active
        after the first as after all of them, and the idle timeouts are minutes), else None."""
        if now - self._touched.get(sandbox_id, -TOUCH_EVERY) < TOUCH_EVERY:
            return None
        if len(self._touched) >= TOUCHED_KEPT:  # the ones not seen for a while go
            self._touched = {s: t for s, t in self._touched.items() if now - t < TOUCH_EVERY}
        return now

    async def _touch(self, sandbox_id: str) -> None:
        """The sandbox's activity (its idle deadline), as `_touch_due` allows."""
        now = self._touch_due(sandbox_id, time.monotonic())
        if now is None:
            return
        self._touched[sandbox_id] = now
        await self._sandboxes.touch(sandbox_id)

    async def _note_state(
        self,
        sandbox: SandboxRecord,
        conversation_id: str,
        status: ExecutionStatus | None,
        metrics: MetricsSnapshot | None,
        *,
        ordered: bool = True,
    ) -> None:
        """Keep the status and the cost; the budget recorded at the start stays when the agent
        reports none, and is enforced here for agents that do not enforce it themselves.

        `ordered` False: a ConversationInfo. The official server posts each one from a task of
        its own, so an older one may land after a newer one (or after the ordered state events):
        from it, a status only when none is known yet, and never a lower cost."""
        over = False
        spec = self._catalog.find(sandbox.spec_id)
        racy = not ordered and spec is not None and spec.agent_kind not in ENFORCED_BY_AGENT

        def change(record: AppConversationInfo) -> None:
            nonlocal over
            over = False
            if status is not None and not (racy and record.execution_status is not None):
                record.execution_status = status
            lower = (
                racy
                and metrics is not None
                and record.metrics is not None
                and metrics.accumulated_cost < record.metrics.accumulated_cost
            )
            if metrics is not None and not lower:
                before = record.metrics
                budget = metrics.max_budget_per_task
                if budget is None and before is not None:
                    budget = before.max_budget_per_task
                record.metrics = metrics.model_copy(update={"max_budget_per_task": budget})
                over = crossed(before, record.metrics, budget)

        updated = await self._records.update(conversation_id, change)
        if not over or updated is None:
            return
        if spec is not None and spec.agent_kind not in ENFORCED_BY_AGENT:
            url = sandbox.agent_url(self._url_host)
            self._budget.enforce(url, sandbox, updated)

    async def ingest_info(
        self, sandbox_id: str, key: str | None, body: dict[str, Any], *, verified: bool = False
    ) -> None:
        """A ConversationInfo from the agent: keep its status and cost (from ``stats``; never
        the title the user chose, never the creation time). `verified`: as `ingest`'s."""
        found = await self._sandboxes.record(sandbox_id) if verified else None
        sandbox = found or await self._sandbox(sandbox_id, key)
        status = status_in(body.get("execution_status"))
        metrics = readable_metrics(body)
        info = await self._conversation(sandbox_id, str(body.get("id", "")))
        if info is None:
            return
        await self._note_state(sandbox, info.id, status, metrics, ordered=False)
        await self._sandboxes.touch(sandbox_id)

    # -- reading -----------------------------------------------------------------------------

    async def search(self, principal: Principal, query: EventSearchQuery) -> EventPage:
        info = await self._conversations.owned(principal, query.conversation_id__eq)
        desc = query.sort_order == EventSortOrder.TIMESTAMP_DESC
        after = decode_cursor(query.page_id, STREAM_ID)
        found: list[StoredEvent] = []
        size = max(query.limit + 1, 200)
        while len(found) <= query.limit:
            # Entries that are not events are left out by the store (a page may hold fewer).
            batch = await self.store.page(info.id, after, size, desc)
            found += [item for item in batch.events if _matches(item[1], query)]
            if batch.read < size:
                break
            after = batch.last
        page = found[: query.limit]
        next_id = encode_cursor(page[-1][0]) if len(found) > query.limit else None
        # Events a rewind superseded are kept, and carry `rewound_by` (its checkpoint).
        items = self.store.marked(page, await self.store.rewound(info.id))
        return EventPage(items=items, next_page_id=next_id)

    async def count(self, principal: Principal, filters: EventFilters) -> int:
        info = await self._conversations.owned(principal, filters.conversation_id__eq)
        if (
            filters.kind__eq is None
            and filters.timestamp__gte is None
            and (filters.timestamp__lt is None)
        ):
            return await self.store.count(info.id)
        total, after = 0, None
        while True:
            batch = await self.store.page(info.id, after, 1000, False)
            total += sum(1 for _sid, e in batch.events if _matches(e, filters))
            if batch.read < 1000:
                return total
            after = batch.last

    async def batch(self, principal: Principal, ids: list[str]) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for place in await self.store.locate(ids):
            if place is None:
                out.append(None)
                continue
            conversation_id, stream_id = place
            try:
                await self._conversations.owned(principal, conversation_id)
            except NotFound:
                out.append(None)
                continue
            event = await self.store.get_at(conversation_id, stream_id)
            if event is not None:
                marks = await self.store.rewound(conversation_id)
                event = self.store.marked([(stream_id, event)], marks)[0]
            out.append(event)
        return out

    async def feed(
        self, principal: Principal, conversation_id: str, after_event: str | None, resend_all: bool
    ) -> FeedStart:
        """Where a live socket on the caller's conversation starts: after `after_event`, else
        at the first event (`resend_all`) or after those stored by now. Raises NotFound (the
        conversation is not the caller's, or the event not in it)."""
        info = await self._conversations.owned(principal, conversation_id)
        after = await self._start_point(info.id, after_event)
        if not resend_all and after_event is None:
            after = await self.store.newest_id(info.id)  # an entry that is not an event too
        return FeedStart(info.id, after)

    def subscribe(self, start: FeedStart) -> Subscription:
        """The conversation's events from `start` on, through this replica's one shared read
        of it (events/fanout.py); close the subscription when the socket ends."""
        return self.fanout.subscribe(start.conversation_id, start.after)

    async def conversation_ticket(self, principal: Principal, conversation_id: str) -> Ticket:
        """A single-use ticket for the events socket of the caller's conversation
        (auth/tickets.py; as the socket allows). Raises NotFound."""
        info = await self._conversations.owned(principal, conversation_id)
        return await self._tickets.mint(principal, "conversation", info.id)

    async def sandbox_ticket(self, principal: Principal, sandbox_id: str) -> Ticket:
        """A single-use ticket for a WebSocket to the caller's own sandbox through the proxy
        (as the proxy allows: the owner's alone, not an admin's for someone else's). Raises
        SandboxNotFound."""
        record = await self._sandboxes.owned(principal, sandbox_id)
        if record.owner != principal.user_id:
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return await self._tickets.mint(principal, "sandbox", record.id)

    async def _start_point(self, conversation_id: str, after_event: str | None) -> str:
        """The stream id a live socket starts after: "0" for everything."""
        if after_event is None:
            return "0"
        (place,) = await self.store.locate([after_event])
        if place is None or place[0] != conversation_id:
            raise NotFound(f"event {after_event} not found in conversation {conversation_id}")
        return place[1]
