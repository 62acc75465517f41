"""The gauges of /metrics, computed from Redis at scrape time so that every replica reports the
same totals: sandboxes by status, conversations by execution status, the warm pool, and the
lifecycle webhook deliveries not yet made.

The sandboxes' and the conversations' gauges read one set per status (kept with each change
of a record by the stores' scripts and transactions: sandboxes/store.py `count_by_status`,
conversations/store.py `count_by_execution_status`): a few commands whatever the number of
sandboxes and conversations. A replica still runs one refresh at a time (`Refresher`): scrapes
that arrive while one runs wait for it and answer its figures, so a crowd of scrapes (or of
unauthenticated ones with ACS_METRICS_PUBLIC) costs Redis one refresh, not one each.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.conversations.store import count_by_execution_status
from controlplane.lifecycle.outbox import Outbox
from controlplane.metrics import NO_STATUS, Metrics
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.pool_store import pool_counts
from controlplane.sandboxes.store import count_by_status


async def refresh(metrics: Metrics, redis: aioredis.Redis, outbox: Outbox | None = None) -> None:
    """Recompute the gauges: sandboxes and conversations by status, the warm pool,
    and the lifecycle webhook `outbox` when there is one."""
    sandboxes = await count_by_status(redis)
    members, metrics.pool_events.values = await pool_counts(redis)
    conversations = {
        status or NO_STATUS: count
        for status, count in (await count_by_execution_status(redis)).items()
    }
    gauges = metrics.from_redis
    gauges.sandboxes = {status.value: sandboxes.get(status.value, 0) for status in SandboxStatus}
    gauges.pool_members = dict(members)
    gauges.conversations = {
        label: conversations.get(label, 0)
        for label in [*(s.value for s in ExecutionStatus), NO_STATUS]
    }
    if outbox is not None:
        gauges.webhook_pending = await outbox.pending()


class Refresher:
    """`refresh`, one at a time on this replica: a caller that finds one running waits for
    that one (its figures are at most as old as that caller's request)."""

    def __init__(self) -> None:
        self._running: asyncio.Task[None] | None = None

    async def refresh(
        self, metrics: Metrics, redis: aioredis.Redis, outbox: Outbox | None = None
    ) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(refresh(metrics, redis, outbox))
        # Shielded: one scrape's client going away does not cancel the others' refresh.
        await asyncio.shield(self._running)
