"""``WS /sockets/events/{conversation_id}``: a conversation's events, live (as the official
agent server serves them).

Authentication: ``session_api_key`` query parameter, ``X-Session-API-Key`` header, or a first
frame ``{"type": "auth", "session_api_key": ...}`` within 10 s; a bad key closes with 4001,
an unknown conversation with 4004. On connect the socket gets a ``full_state``
``ConversationStateUpdateEvent`` (never stored), then the stored events when asked
(``resend_mode=all``, ``resend_all=true``, or ``resend_mode=since&after_timestamp=``), then
every new event as it is emitted. A frame from the client is a user message that starts or
continues the run.

Each socket reads the conversation's event list through its own cursor, so nothing is buffered
per socket beyond the connection's write buffer; a reader that does not take a frame within
``SEND_TIMEOUT`` seconds is dropped (its connection is aborted), never the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiohttp import WSMsgType, web
from pydantic import ValidationError

from ..auth import key_is_valid
from ..config import CONFIG_KEY
from . import events as ev
from .conversation import Conversation
from .legacy_names import for_browsers
from .models import SendMessageRequest, normalize_conversation_id
from .mount import CONVERSATIONS
from .queries import event_time, naive_utc
from .service import ConversationService

log = logging.getLogger(__name__)

AUTH_TIMEOUT = 10.0
SEND_TIMEOUT = 10.0
MAX_SOCKETS_PER_CONVERSATION = 50
MAX_FRAME = 1024 * 1024
CLOSE_AUTH, CLOSE_NOT_FOUND, CLOSE_SLOW = 4001, 4004, 1013


class SlowReader(Exception):
    """The client did not take a frame in time."""


async def _close(ws: web.WebSocketResponse, code: int, reason: str) -> web.WebSocketResponse:
    await ws.close(code=code, message=reason.encode())
    return ws


def _is_auth_frame(data: Any) -> bool:
    return isinstance(data, dict) and data.get("type") == "auth"


async def _authenticate(ws: web.WebSocketResponse, request: web.Request) -> bool:
    keys = request.app[CONFIG_KEY].api_keys
    if not keys:
        return True
    presented = request.query.get("session_api_key") or request.headers.get("X-Session-API-Key")
    if presented is None:
        try:
            first = await ws.receive(timeout=AUTH_TIMEOUT)
            data = json.loads(first.data) if first.type == WSMsgType.TEXT else None
        except (TimeoutError, ValueError):
            data = None
        if isinstance(data, dict) and _is_auth_frame(data):
            presented = str(data.get("session_api_key") or "")
    return key_is_valid(presented, keys)


def _resend_mode(request: web.Request) -> tuple[str | None, datetime | None]:
    mode = request.query.get("resend_mode")
    if mode is None and request.query.get("resend_all", "").lower() in ("true", "1", "yes"):
        mode = "all"
    after = None
    if mode == "since":
        try:
            after = naive_utc(datetime.fromisoformat(request.query.get("after_timestamp", "")))
        except ValueError:
            after = None  # as the official server: nothing is resent without a valid time
    return mode, after


async def _send(ws: web.WebSocketResponse, event: dict[str, Any], browser: bool = False) -> None:
    if browser:
        event = for_browsers(event)
    try:
        await asyncio.wait_for(ws.send_str(json.dumps(event)), SEND_TIMEOUT)
    except TimeoutError:
        raise SlowReader from None


async def _pump(
    ws: web.WebSocketResponse,
    request: web.Request,
    conv: Conversation,
    wake: asyncio.Event,
    *,
    history: list[dict[str, Any]],
    cursor: int,
) -> None:
    """The full state, the requested history, then every event from ``cursor`` on."""
    browser = "Origin" in request.headers  # legacy_names.py: the old terminal names for them
    try:
        await _send(ws, conv.full_state())
        for event in history:
            await _send(ws, event, browser)
        while not ws.closed:
            wake.clear()
            while cursor < len(conv.events):
                await _send(ws, conv.events[cursor], browser)
                cursor += 1
            if conv.closed:
                await _close(ws, CLOSE_NOT_FOUND, "Conversation deleted")
                return
            await wake.wait()
    except SlowReader:
        # A close frame could not get through either: drop the connection itself.
        log.warning("conversation %s: a socket reader too slow was dropped", conv.id)
        conv.listeners.discard(wake)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionResetError:
        return


def _message(data: Any) -> SendMessageRequest:
    if not isinstance(data, dict):
        raise ValueError("a message must be a JSON object")
    return SendMessageRequest.model_validate({**data, "run": True})


def _lookup(service: ConversationService, raw: str) -> Conversation | None:
    try:
        return service.conversations.get(normalize_conversation_id(raw))
    except ValueError:
        return None


def make_handler(
    service_of: Callable[[web.Request], ConversationService],
) -> Callable[[web.Request], Any]:
    async def events_socket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=MAX_FRAME)
        await ws.prepare(request)
        if not await _authenticate(ws, request):
            return await _close(ws, CLOSE_AUTH, "Authentication failed")
        service = service_of(request)
        conv = _lookup(service, request.match_info["conversation_id"])
        if conv is None or conv.closed:
            return await _close(ws, CLOSE_NOT_FOUND, "Conversation not found")
        if len(conv.listeners) >= MAX_SOCKETS_PER_CONVERSATION:
            return await _close(ws, CLOSE_SLOW, "Too many connections for this conversation")
        request.app[CONVERSATIONS].sockets.add(ws)  # closed at shutdown (mount.py)
        wake = asyncio.Event()
        conv.listeners.add(wake)
        mode, after = _resend_mode(request)
        cursor = len(conv.events)  # no await since the listener was added: nothing is missed
        history: list[dict[str, Any]] = []
        if mode == "all":
            cursor = 0
        elif mode == "since" and after is not None:
            history = [
                e for e in conv.events[:cursor] if (t := event_time(e)) is not None and t >= after
            ]
        pump = asyncio.create_task(_pump(ws, request, conv, wake, history=history, cursor=cursor))
        try:
            async for frame in ws:
                if frame.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(frame.data)
                    if _is_auth_frame(data):
                        continue
                    service.send_message(conv, _message(data))
                except (ValueError, ValidationError) as exc:
                    error = ev.server_error_event(type(exc).__name__, str(exc)[:2000])
                    with contextlib.suppress(ConnectionResetError):
                        await ws.send_str(json.dumps(error))
        finally:
            conv.listeners.discard(wake)
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        return ws

    return events_socket
