"""Outgoing lifecycle webhooks: HMAC-SHA256 signed, retried with backoff, in order per URL."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time

import aiohttp
import structlog

from controlplane.lifecycle.models import LifecycleEvent

log = structlog.get_logger(__name__)

SIGNATURE_HEADER = "X-ACS-Signature"
"""`sha256=<hex HMAC-SHA256 of the raw body, keyed with ACS_LIFECYCLE_WEBHOOK_SECRET>`."""
TIMESTAMP_HEADER = "X-ACS-Timestamp"
MAX_ATTEMPTS = 8
QUEUE_LIMIT = 10_000


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookSender:
    """One queue and one worker per URL, so a slow receiver never delays another."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        urls: list[str],
        secret: str | None,
        base_delay: float = 0.5,
    ) -> None:
        self._http = http
        self._secret = secret
        self._base_delay = base_delay
        self._queues = {url: asyncio.Queue[LifecycleEvent](QUEUE_LIMIT) for url in urls}
        self._workers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._workers = [
            asyncio.create_task(self._work(url, queue), name=f"webhook-{url}")
            for url, queue in self._queues.items()
        ]

    def send(self, event: LifecycleEvent) -> None:
        for url, queue in self._queues.items():
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                log.error("lifecycle_webhook_dropped", url=url, event_id=event.id)

    async def _work(self, url: str, queue: asyncio.Queue[LifecycleEvent]) -> None:
        while True:
            event = await queue.get()
            await self._deliver(url, event)

    async def _deliver(self, url: str, event: LifecycleEvent) -> bool:
        body = event.model_dump_json().encode()
        headers = {
            "Content-Type": "application/json",
            "X-ACS-Event": event.type.value,
            "X-ACS-Delivery": event.id,
            TIMESTAMP_HEADER: str(int(time.time())),
        }
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        delay = self._base_delay
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                async with self._http.post(
                    url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    if resp.status < 300:
                        return True
                    if 400 <= resp.status < 500 and resp.status not in (408, 429):
                        log.warning(
                            "lifecycle_webhook_rejected",
                            url=url,
                            status=resp.status,
                            event_id=event.id,
                        )
                        return False
                    error = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = repr(exc)
            log.info("lifecycle_webhook_retry", url=url, attempt=attempt, error=error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        log.error("lifecycle_webhook_gave_up", url=url, event_id=event.id)
        return False

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
