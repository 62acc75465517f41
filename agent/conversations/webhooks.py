"""Ordered webhook delivery to the control plane, one sender task per conversation.

``POST <base>/events/<conversation id>`` with a JSON array of events and
``POST <base>/conversations`` with a ConversationInfo. Items leave in the order they
were queued; whatever queued while a POST was in flight goes in the next one (events
batched, consecutive ConversationInfos collapsed to the newest). A POST is retried with
backoff (0.2 s doubling to 5 s) until accepted; a 4xx other than 408/429 drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Literal

import aiohttp

log = logging.getLogger(__name__)

API_KEY_HEADER = "X-Session-API-Key"
MAX_BATCH = 100
POST_TIMEOUT = 30.0
Kind = Literal["event", "info"]


class WebhookSender:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        conversation_id: str,
        api_key: str | None,
        *,
        min_backoff: float = 0.2,
        max_backoff: float = 5.0,
    ) -> None:
        base = base_url.rstrip("/")
        self._urls: dict[Kind, str] = {
            "event": f"{base}/events/{conversation_id}",
            "info": f"{base}/conversations",
        }
        self._session = session
        self._headers = {API_KEY_HEADER: api_key} if api_key else {}
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._queue: deque[tuple[Kind, dict[str, Any]]] = deque()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"webhooks:{self._urls['event']}")

    def send_event(self, event: dict[str, Any]) -> None:
        self._put("event", event)

    def send_info(self, info: dict[str, Any]) -> None:
        self._put("info", info)

    def _put(self, kind: Kind, item: dict[str, Any]) -> None:
        self._queue.append((kind, item))
        self._idle.clear()
        self._wakeup.set()

    def _head(self) -> tuple[Kind, Any, int]:
        """The next POST: its kind, body and how many queued items it covers."""
        kind = self._queue[0][0]
        count = 0
        for item_kind, _ in self._queue:
            if item_kind != kind or count == MAX_BATCH:
                break
            count += 1
        items = [self._queue[i][1] for i in range(count)]
        return kind, (items if kind == "event" else items[-1]), count

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            kind, body, count = self._head()
            await self._deliver(kind, body)
            for _ in range(count):
                self._queue.popleft()

    async def _deliver(self, kind: Kind, body: Any) -> None:
        url = self._urls[kind]
        delay = self._min_backoff
        timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT)
        while True:
            try:
                async with self._session.post(
                    url, json=body, headers=self._headers, timeout=timeout
                ) as resp:
                    await resp.read()
                    if resp.status < 400:
                        return
                    if resp.status not in (408, 429) and resp.status < 500:
                        log.warning("webhook %s answered %d: %s dropped", url, resp.status, kind)
                        return
                    reason = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = type(exc).__name__
            log.info("webhook %s failed (%s); retrying in %.1f s", url, reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_backoff)

    async def close(self, flush_timeout: float = 0.0) -> None:
        """Stop, after waiting up to ``flush_timeout`` seconds for the queue to drain."""
        if self._task is None:
            return
        if flush_timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), flush_timeout)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
