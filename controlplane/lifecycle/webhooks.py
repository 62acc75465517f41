"""Delivering the lifecycle webhook outbox (controlplane/lifecycle/outbox.py): HMAC-SHA256
signed POSTs, at least once, with exponential backoff, across restarts and replicas.

Every replica runs one loop per URL. New entries come from XREADGROUP, so each goes to one
replica; the first attempt is immediate. An attempt that fails leaves the entry pending; once it
has been idle for the backoff of its attempt count (base · 2^(n-1), capped), any replica may
claim it with XCLAIM, whose min-idle condition lets exactly one of them win. A replica that dies
mid-attempt leaves its entries pending: they are claimed the same way. Success acknowledges and
deletes the entry; an entry older than the dead-letter time whose attempt fails moves to the
URL's dead-letter stream. Deliveries are not ordered: receivers order by `timestamp`.

The receivers are the operator's: they are called through the outbound policy of operator URLs
(controlplane/outbound): never a redirect (a 3xx is a failed attempt), the address connected
to the one resolved and checked (never link-local, multicast or reserved).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import structlog
from redis.exceptions import ResponseError

from controlplane.background import stop_tasks
from controlplane.lifecycle.outbox import DEAD_MAXLEN, GROUP, Outbox, url_id
from controlplane.outbound.client import OutboundClient, refusal_of
from controlplane.store import text
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)

SIGNATURE_HEADER = "X-ACS-Signature"
"""`sha256=<hex HMAC-SHA256 of the raw body, keyed with ACS_LIFECYCLE_WEBHOOK_SECRET>`."""
TIMESTAMP_HEADER = "X-ACS-Timestamp"
DELIVERY_HEADER = "X-ACS-Delivery"
"""The event id: the same on every attempt, so receivers de-duplicate on it."""
ATTEMPT_HEADER = "X-ACS-Attempt"


def _nested_id(event: dict[str, Any]) -> str:
    """An audit entry's id (ECS: `event.id`)."""
    inner = event.get("event")
    return str(inner.get("id")) if isinstance(inner, dict) else ""


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 1.0
    cap: float = 300.0
    dead_after: float = 86400.0
    timeout: float = 10.0
    """How long one attempt may take."""
    margin: float = 2.0
    """Added to `timeout` for the shortest wait (a slow event loop, clocks)."""

    def backoff_ms(self, attempts: int) -> int:
        """How long an entry attempted `attempts` times waits before the next attempt, counted
        from the start of the last one: never less than an attempt can last, so that no replica
        claims an entry another is still sending (the one deliverer per event)."""
        wait = min(self.base * 2 ** max(attempts - 1, 0), self.cap)
        return int(max(wait, self.timeout + self.margin) * 1000)


@dataclass
class DeliveryHooks:
    """Counters the metrics module provides (this module must not import it)."""

    delivered: Callable[[], None] = lambda: None
    retried: Callable[[], None] = lambda: None
    dead_lettered: Callable[[], None] = lambda: None


class WebhookDeliverer:
    def __init__(
        self,
        outbox: Outbox,
        http: OutboundClient,
        secret: str | None,
        policy: RetryPolicy,
        *,
        hooks: DeliveryHooks | None = None,
        poll: float = 1.0,
    ) -> None:
        self._outbox = outbox
        self._redis: aioredis.Redis = outbox.redis
        self._http = http
        self._secret = secret
        self._policy = policy
        self._hooks = hooks or DeliveryHooks()
        self._poll = poll
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(url), name=f"webhook-{url_id(url)}")
            for url in self._outbox.urls
        ]

    async def close(self) -> None:
        """Stop at once: an attempt cut off here stays pending and is claimed again later."""
        await stop_tasks(self._tasks)

    async def _run(self, url: str) -> None:
        ready = False
        while True:
            try:
                if not ready:
                    await self._outbox.ensure_group(url)
                    ready = True
                await self._retry_due(url)
                await self._read_new(url)
            except (*REDIS_DOWN, ResponseError) as exc:
                # Redis away, or the stream or group gone (NOGROUP): wait, then make it again.
                log.warning("lifecycle_webhook_outbox_unavailable", url=url_id(url), error=str(exc))
                ready = False
                await asyncio.sleep(self._poll)

    async def _read_new(self, url: str) -> None:
        """One new entry at a time: Redis counts an entry's idle time from the read, and other
        replicas may claim it once that passes the first backoff. A read of several, sent one
        after another to a slow receiver, left the last ones idle past it before their first
        attempt, and two replicas delivered them (tests/lifecycle/test_outbox.py)."""
        key = self._outbox.stream(url)
        found: Any = await self._redis.xreadgroup(
            GROUP, self.consumer, {key: ">"}, count=1, block=int(self._poll * 1000)
        )
        for _stream, entries in found or []:
            for entry_id, fields in entries:
                await self._attempt(url, text(entry_id), fields, attempt=1)

    async def _retry_due(self, url: str) -> None:
        key = self._outbox.stream(url)
        waiting: Any = await self._redis.xpending_range(
            key, GROUP, "-", "+", 100, idle=self._policy.backoff_ms(1)
        )
        for item in waiting:
            attempts = int(item["times_delivered"])
            due = self._policy.backoff_ms(attempts)
            if int(item["time_since_delivered"]) < due:
                continue
            claimed: Any = await self._redis.xclaim(
                key, GROUP, self.consumer, due, [item["message_id"]]
            )
            for entry_id, fields in claimed:
                if fields:  # None: deleted meanwhile (delivered by a replica that then died)
                    await self._attempt(url, text(entry_id), fields, attempt=attempts + 1)

    async def _attempt(self, url: str, entry_id: str, fields: dict[Any, Any], attempt: int) -> None:
        body = text(fields.get(b"e", fields.get("e"))).encode()
        event = json.loads(body)
        error = await self._post(url, body, event, attempt)
        key = self._outbox.stream(url)
        if error is None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xack(key, GROUP, entry_id)
                pipe.xdel(key, entry_id)
                await pipe.execute()
            self._hooks.delivered()
            return
        age = time.time() - int(entry_id.split("-", maxsplit=1)[0]) / 1000
        if age < self._policy.dead_after:
            self._hooks.retried()
            log.info(
                "lifecycle_webhook_retry",
                url=url_id(url),
                event_id=event.get("id"),
                attempt=attempt,
                next_in_s=self._policy.backoff_ms(attempt) / 1000,
                error=error,
            )
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(
                self._outbox.dead_stream(url),
                {"e": body, "attempts": attempt, "error": error, "dead_at": int(time.time())},
                maxlen=DEAD_MAXLEN,
                approximate=True,
            )
            pipe.xack(key, GROUP, entry_id)
            pipe.xdel(key, entry_id)
            await pipe.execute()
        self._hooks.dead_lettered()
        log.error(
            "lifecycle_webhook_dead_lettered",
            url=url_id(url),
            event_id=event.get("id"),
            attempts=attempt,
            error=error,
        )

    async def _post(self, url: str, body: bytes, event: dict[str, Any], attempt: int) -> str | None:
        """None on a 2xx answer, else what went wrong. Every failure is retried: a receiver
        answering 4xx during a deploy should not lose events."""
        headers = {
            "Content-Type": "application/json",
            "X-ACS-Event": str(event.get("type") or self._outbox.kind),
            DELIVERY_HEADER: str(event.get("id") or _nested_id(event)),
            ATTEMPT_HEADER: str(attempt),
            TIMESTAMP_HEADER: str(int(time.time())),
        }
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        try:
            async with self._http.post(
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._policy.timeout),
            ) as resp:
                return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            refused = refusal_of(exc)  # the outbound policy's: say so, it will not change
            return f"DestinationRefused: {refused}" if refused else type(exc).__name__
