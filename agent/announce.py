"""Telling the control plane that this server listens: one ``POST <webhook base>/ready``.

The control plane would otherwise find out by polling ``/health`` many times per boot, which costs
it CPU for every sandbox starting at once. The call is a hint: the control plane still confirms
with one ``/health`` and polls slowly when no hint arrives, so a failed announcement only makes
the start slower, never fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import aiohttp
from aiohttp import web

from .config import CONFIG_KEY

log = logging.getLogger(__name__)

API_KEY_HEADER = "X-Session-API-Key"
ATTEMPTS = 3
FIRST_RETRY_DELAY = 0.2
ANNOUNCE_TASK: web.AppKey[asyncio.Task[bool]] = web.AppKey("announce_task")


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound and listening before the application starts: connections made from then on wait in
    the backlog, so the announcement can go out before aiohttp serves the first request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


async def announce(base_url: str, api_key: str | None) -> bool:
    """POST ``<base_url>/ready``; True when the control plane took it. Retried twice on a
    connection failure or a 5xx (the listener may be restarting), never raises."""
    url = f"{base_url.rstrip('/')}/ready"
    headers = {API_KEY_HEADER: api_key} if api_key else {}
    delay = FIRST_RETRY_DELAY
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for attempt in range(ATTEMPTS):
            try:
                async with http.post(url, headers=headers) as resp:
                    if resp.status < 500:
                        if resp.status >= 400:
                            log.warning("ready announcement refused: HTTP %d", resp.status)
                        return resp.status < 300
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.info("ready announcement attempt %d failed: %r", attempt + 1, exc)
            if attempt + 1 < ATTEMPTS:
                await asyncio.sleep(delay)
                delay *= 2
    return False


async def _start(app: web.Application) -> None:
    config = app[CONFIG_KEY]
    if config.webhook_base_url:
        key = config.api_keys[0] if config.api_keys else None
        app[ANNOUNCE_TASK] = asyncio.create_task(announce(config.webhook_base_url, key))


async def _stop(app: web.Application) -> None:
    task = app.get(ANNOUNCE_TASK)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def announce_when_started(app: web.Application) -> None:
    """Send the announcement once the application starts (the socket already listens)."""
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
