"""The audit log's sinks, its long-term copy: webhooks (the lifecycle webhooks' outbox and
deliverer, on streams of their own) and standard output.

Each sink has an outbox stream that every entry is added to by the write that stores the entry
(controlplane/store/audit.py), so a sink misses nothing the log holds, whatever dies when. The
standard output sink is read through the consumer group `deliverers` as the webhooks' outboxes
are: each entry is printed by one replica, once it is acknowledged it is deleted, and what a
replica that died had read but not printed is claimed by another after CLAIM_IDLE_MS.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
import time
from typing import Any, TextIO

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ResponseError

from controlplane.background import stop_tasks
from controlplane.config import ServiceConfig
from controlplane.lifecycle.outbox import GROUP, Outbox
from controlplane.store import keyspace, text
from controlplane.store.audit import AuditLog
from controlplane.store.audit_flood import AnonymousLimits
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)

STDOUT = "stdout"
"""The standard output sink's name in its outbox stream's key (keyspace.audit_outbox)."""
CLAIM_IDLE_MS = 30_000
BATCH = 64


def sink_outbox(redis: aioredis.Redis, urls: list[str]) -> Outbox:
    """The webhook sinks' outbox (delivered by lifecycle/webhooks.py's WebhookDeliverer)."""
    return Outbox(
        redis, urls, kind="audit", stream_of=keyspace.audit_outbox, dead_of=keyspace.audit_dead
    )


def audit_log(config: ServiceConfig, redis: aioredis.Redis) -> AuditLog:
    """The audit log's writer: its retention, its sinks' outbox streams, and the deployment's
    own secrets, redacted wherever a client might have put one (the CLI makes one too)."""
    sinks = sink_outbox(redis, config.audit_sink_urls).streams()
    if config.audit_stdout:
        sinks.append(keyspace.audit_outbox(STDOUT))
    return AuditLog(
        redis,
        retention=config.audit_retention,
        sink_streams=sinks,
        secrets_=(
            config.bootstrap_api_key,
            config.secret_key,
            config.oidc_client_secret,
            config.lifecycle_webhook_secret,
            config.audit_sink_secret,
        ),
        anonymous=AnonymousLimits(
            per_source=config.audit_anonymous_per_source,
            per_window=config.audit_anonymous_per_window,
            window=config.audit_anonymous_window,
        ),
    )


class StdoutSink:
    """Prints every audit entry, one JSON line each, on this process's standard output."""

    def __init__(self, redis: aioredis.Redis, out: TextIO | None = None, poll: float = 1.0) -> None:
        self._redis = redis
        self._out = out
        self._poll = poll
        self.stream = keyspace.audit_outbox(STDOUT)
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(), name="audit-stdout")]

    async def close(self) -> None:
        await stop_tasks(self._tasks)

    async def _run(self) -> None:
        ready = False
        while True:
            try:
                if not ready:
                    await self._ensure_group()
                    ready = True
                claimed: Any = await self._redis.xautoclaim(
                    self.stream, GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=BATCH
                )
                await self._print(claimed[1])
                found: Any = await self._redis.xreadgroup(
                    GROUP,
                    self.consumer,
                    {self.stream: ">"},
                    count=BATCH,
                    block=int(self._poll * 1000),
                )
                for _stream, entries in found or []:
                    await self._print(entries)
            except (*REDIS_DOWN, ResponseError) as exc:
                log.warning("audit_stdout_unavailable", error=str(exc))
                ready = False
                await asyncio.sleep(self._poll)

    async def _ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _print(self, entries: list[Any]) -> None:
        done = []
        out = self._out or sys.stdout
        for entry_id, fields in entries:
            if fields:
                out.write(text(fields.get(b"e", fields.get("e"))) + "\n")
            done.append(text(entry_id))
        if not done:
            return
        out.flush()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, GROUP, *done)
            pipe.xdel(self.stream, *done)
            await pipe.execute()


async def summarize_dropped(audit: AuditLog) -> None:
    """Write, at each window's end, the summary of the anonymous failures the window left out
    (store/audit_flood.py): a flood that stops still has its count in the log. Every replica
    runs it; each summary is written once."""
    window = audit.anonymous.limits.window
    while True:
        await asyncio.sleep(window - time.time() % window + 0.05)
        try:
            await audit.anonymous.summarize()
        except REDIS_DOWN as exc:
            log.warning("audit_summary_not_stored", error=str(exc))
