"""The gauges of /metrics, computed from Redis at scrape time so that every replica reports the
same totals: sandboxes by status, conversations by execution status, the warm pool, and the
lifecycle webhook deliveries not yet made."""

from __future__ import annotations

import redis.asyncio as aioredis

from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.conversations.store import count_by_execution_status
from controlplane.lifecycle.outbox import Outbox
from controlplane.metrics import NO_STATUS, Metrics
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.pool_store import pool_counts
from controlplane.sandboxes.store import count_by_status


async def refresh(metrics: Metrics, redis: aioredis.Redis, outbox: Outbox | None = None) -> None:
    """Recompute the gauges: every sandbox and conversation (in pages), the warm pool, and the
    lifecycle webhook `outbox` when there is one."""
    sandboxes = await count_by_status(redis)
    for status in SandboxStatus:
        metrics.sandboxes.labels(status.value).set(sandboxes.get(status.value, 0))
    members, metrics.pool_events.values = await pool_counts(redis)
    metrics.pool_members.clear()
    for (spec, state), count in members.items():
        metrics.pool_members.labels(spec, state).set(count)
    conversations = {
        status or NO_STATUS: count
        for status, count in (await count_by_execution_status(redis)).items()
    }
    for label in [*(s.value for s in ExecutionStatus), NO_STATUS]:
        metrics.conversations.labels(label).set(conversations.get(label, 0))
    if outbox is not None:
        metrics.webhook_pending.set(await outbox.pending())
