"""/api/v1/events (search, count, batch, live socket) and the sandbox webhooks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from typing import Any

import structlog
from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import BaseModel, TypeAdapter, ValidationError

from controlplane import keys
from controlplane.api.parsing import (
    RequestValidationError,
    error_items,
    invalid,
    json_response,
    parse_body,
    parse_query,
)
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import PRINCIPAL, authenticate_request, principal_of
from controlplane.auth.models import Principal
from controlplane.errors import Unauthorized
from controlplane.events.fanout import ConversationGone, Subscription
from controlplane.events.frames import frame_text
from controlplane.events.legacy_names import with_old_terminal_names
from controlplane.events.models import (
    ConversationEventQuery,
    Event,
    EventBatchQuery,
    EventFilters,
    EventPage,
    EventSearchQuery,
    EventSocketQuery,
    WebSocketHandshake,
)
from controlplane.events.socket_cap import SocketCap
from controlplane.sandboxes.models import Success

log = structlog.get_logger(__name__)

routes = RouteTable(tag="events")
# Served by the API and by the webhook listener on the sandbox networks' gateways (app.py).
webhook_routes = RouteTable(tag="events")


def track_sockets(app: web.Application, per_user: int) -> None:
    """Live sockets are closed when the server shuts down, so they do not hold it up; each user
    holds at most `per_user` of them on this replica (events/socket_cap.py)."""
    sockets: keys.OpenSockets = weakref.WeakSet()
    app[keys.OPEN_SOCKETS] = sockets
    app[keys.SOCKET_CAP] = SocketCap(per_user)

    async def close_all(_app: web.Application) -> None:
        for ws in list(sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    app.on_shutdown.append(close_all)


_EVENT = TypeAdapter(Event)
CONVERSATION_GONE = 4004
"""The close code of a socket whose conversation was deleted (the agent server's 4004)."""


class ConversationInfoBody(BaseModel):
    """What an agent posts to the conversations webhook (extra fields kept as they are)."""

    model_config = {"extra": "allow"}
    id: str


@routes.route(
    "GET",
    "/api/v1/events/search",
    summary="Search a conversation's events",
    query=EventSearchQuery,
    response=EventPage,
    errors=(404,),
)
async def search_events(request: web.Request) -> web.Response:
    query = parse_query(request, EventSearchQuery)
    return json_response(await request.app[keys.EVENTS].search(principal_of(request), query))


@routes.route(
    "GET",
    "/api/v1/conversation/{conversation_id}/events/search",
    summary="Search a conversation's events (OpenHands' singular path; the web frontends' "
    "history, with the terminal's events under their older names: events/legacy_names.py)",
    query=ConversationEventQuery,
    response=EventPage,
    errors=(404,),
)
async def search_conversation_events(request: web.Request) -> web.Response:
    query = parse_query(request, ConversationEventQuery)
    scoped = query.scoped(request.match_info["conversation_id"])
    page = await request.app[keys.EVENTS].search(principal_of(request), scoped)
    return json_response(page.model_copy(update={"items": with_old_terminal_names(page.items)}))


@routes.route(
    "GET",
    "/api/v1/events/count",
    summary="Count a conversation's events",
    query=EventFilters,
    response=int,
    errors=(404,),
)
async def count_events(request: web.Request) -> web.Response:
    query = parse_query(request, EventFilters)
    return json_response(await request.app[keys.EVENTS].count(principal_of(request), query))


@routes.route(
    "GET",
    "/api/v1/events",
    summary="Get events by id (null for missing)",
    query=EventBatchQuery,
    response=list[dict[str, object] | None],
)
async def batch_events(request: web.Request) -> web.Response:
    query = parse_query(request, EventBatchQuery)
    return json_response(await request.app[keys.EVENTS].batch(principal_of(request), query.id))


@routes.route(
    "GET",
    "/api/v1/events/socket",
    summary="WebSocket: replay a conversation's events, then follow new ones (one JSON per frame)",
    query=EventSocketQuery,
    headers=WebSocketHandshake,
    public=True,  # authenticates itself: browsers cannot set headers on a WebSocket
    status=101,
    errors=(400, 401, 404, 429),  # 400: not a WebSocket handshake; 429: the user's cap
)
async def event_socket(request: web.Request) -> web.StreamResponse:
    query = parse_query(request, EventSocketQuery)
    ws = web.WebSocketResponse(heartbeat=30)
    if not ws.can_prepare(request).ok:  # before the key: a plain GET is a 400 whoever sends it
        raise web.HTTPBadRequest(reason="a WebSocket handshake is required (Upgrade: websocket)")
    # Browsers cannot set headers on a WebSocket: a ticket (auth/tickets.py), else the key in
    # the query, else the browser session cookie (its Origin is checked then).
    if query.acs_ticket is not None:
        principal = await _ticket_holder(request, query.acs_ticket, query.conversation_id)
    else:
        presented = request.headers.get("X-Session-API-Key") or query.session_api_key
        principal = await authenticate_request(request, presented)
    events = request.app[keys.EVENTS]
    start = await events.feed(principal, query.conversation_id, query.after, query.resend_all)
    with request.app[keys.SOCKET_CAP].hold(principal.user_id):  # 429 before the upgrade
        await ws.prepare(request)
        request.app[keys.OPEN_SOCKETS].add(ws)
        subscription = events.subscribe(start)
        try:
            await _pump(ws, subscription)
        finally:
            subscription.close()
    return ws


async def _pump(ws: web.WebSocketResponse, subscription: Subscription) -> None:
    """The conversation's events to the socket, each sent as it was stored (events/fanout.py),
    until the client closes it (or the server does)."""

    closing = False

    async def follow() -> None:
        nonlocal closing
        try:
            async for batch in subscription.batches():
                if ws.closed:
                    break
                await _send_all(ws, batch)
        except ConnectionResetError:
            return  # the client went away
        except ConversationGone:
            # Nothing more will come: the agent server's own close for a conversation it does
            # not have (docs/agent-protocol.md), so the client stops rather than reconnects.
            closing = True
            await ws.close(code=CONVERSATION_GONE, message=b"conversation deleted")
        except Exception as exc:  # the socket ends, never stays open and mute
            # The client reconnects with after= its last event (1011: try again later).
            log.error(
                "event_socket_failed",
                conversation_id=subscription.channel.conversation_id,
                error=repr(exc),
            )
            closing = True
            await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"event feed failed")

    pump = asyncio.create_task(follow())
    try:
        async for message in ws:
            if message.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
    finally:
        subscription.close()
        if not closing:  # else it is closing the socket: let it finish the handshake
            pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
            await pump


CORK_BYTES = 64 * 1024
"""Most a cork holds before it writes (aiohttp's writer's own limit before it drains)."""


class _Corked(asyncio.Transport):
    """What a socket's frames are written to while a batch of them is framed: one write of
    them all to the connection's transport at the end (`_send_all`), not one each; or one per
    CORK_BYTES, so that a batch of large events (a page of 500 at up to the body limit each) is
    not copied whole before the first byte goes, and the transport's flow control still
    pauses the writer (aiohttp drains when the transport has paused it)."""

    def __init__(self, transport: Any) -> None:  # asyncio's or uvloop's (see _send_all)
        super().__init__()
        self.transport = transport
        self._parts: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._parts.append(bytes(data))
        self._size += len(data)
        if self._size >= CORK_BYTES:
            self.flush()

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def get_write_buffer_size(self) -> int:
        return int(self.transport.get_write_buffer_size())

    def flush(self) -> None:
        if self._parts and not self.transport.is_closing():
            self.transport.write(b"".join(self._parts))
        self._parts.clear()
        self._size = 0


async def _send_all(ws: web.WebSocketResponse, frames: list[bytes]) -> None:
    """Each of `frames` (one event's JSON per frame, as OpenHands' clients read them; made once
    per replica, events/frames.py), written to the connection at once: a socket that has
    several events to send makes one write (one system call) instead of one per frame, and
    writes the bytes every other socket of its conversation writes. A socket whose client
    asked for compression is sent the texts through aiohttp, which compresses each for it
    (its writer's transport is the cork meanwhile, so that it too writes at once)."""
    # aiohttp's writer is private: if a release renames it or its transport, every frame goes
    # through aiohttp's own send in a write of its own (slower, still correct), never an error.
    writer: Any = getattr(ws, "_writer", None)
    transport = getattr(writer, "transport", None)
    protocol = getattr(writer, "protocol", None)
    # Not isinstance(asyncio.Transport): uvloop's transports (ACS_EVENT_LOOP) are not
    # registered as such; what is used of one is its write and is_closing.
    if not (
        callable(getattr(transport, "write", None))
        and callable(getattr(transport, "is_closing", None))
    ):
        for frame in frames:
            await ws.send_str(frame_text(frame))
        return
    if not ws.compress and isinstance(getattr(protocol, "writing_paused", None), bool):
        await _write_frames(writer, transport, protocol, frames)
        return
    cork = _Corked(transport)
    writer.transport = cork
    try:
        for frame in frames:
            await ws.send_str(frame_text(frame))
    finally:
        writer.transport = cork.transport
        cork.flush()


async def _write_frames(writer: Any, transport: Any, protocol: Any, frames: list[bytes]) -> None:
    """The frames as they are, CORK_BYTES at a time; waits while the connection is paused (the
    flow control aiohttp's writer applies), and stops, as aiohttp's send does, once the socket
    is closing (no data frame may follow a close frame)."""
    start = 0
    while start < len(frames):
        end, size = start, 0
        while end < len(frames) and (size < CORK_BYTES or end == start):
            size += len(frames[end])
            end += 1
        if getattr(writer, "_closing", False) or transport.is_closing():
            raise ConnectionResetError("the socket is closing")
        transport.write(b"".join(frames[start:end]))
        start = end
        if protocol.writing_paused:
            await protocol._drain_helper()  # aiohttp's own wait for the peer to read


async def _ticket_holder(request: web.Request, ticket: str, conversation_id: str) -> Principal:
    """Who minted `ticket` for this conversation; Unauthorized when it is unknown, used,
    expired or for something else (it is used up either way)."""
    plain = conversation_id.replace("-", "").lower()
    principal = await request.app[keys.TICKETS].redeem(ticket, "conversation", plain)
    if principal is None:
        raise Unauthorized("the ticket is unknown, used, expired or not for this conversation")
    request[PRINCIPAL] = principal
    return principal


def _event_batch(raw: bytes) -> list[tuple[Event, dict[str, Any]]]:
    """A JSON array of events (as agent servers post them) or one event; each is checked for
    its common fields and kept as sent."""
    if not raw.strip():
        raise invalid("body", msg="Field required", error_type="missing")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise invalid("body", msg=f"JSON decode error: {exc}", error_type="json_invalid") from None
    items = body if isinstance(body, list) else [body]
    batch: list[tuple[Event, dict[str, Any]]] = []
    for index, item in enumerate(items):
        try:
            checked = _EVENT.validate_python(item)
        except ValidationError as exc:
            prefix = ["body", str(index)] if isinstance(body, list) else ["body"]
            raise RequestValidationError(
                [{**e, "loc": [*prefix, *e["loc"][1:]]} for e in error_items(exc, "body")]
            ) from None
        batch.append((checked, item))
    return batch


@webhook_routes.route(
    "POST",
    "/api/v1/webhooks/{sandbox_id}/events/{conversation_id}",
    summary="Sandbox → control plane: events, a JSON array or one event (X-Session-API-Key = "
    "the sandbox key)",
    public=True,
    body=list[Event] | Event,
    response=Success,
    errors=(401, 404),
    own_key_check=True,  # the key, the rate and the append in one round trip (ingest)
)
async def events_webhook(request: web.Request) -> web.Response:
    batch = _event_batch(await request.read())
    sandbox_id = request.match_info["sandbox_id"]
    await request.app[keys.EVENTS].ingest(
        sandbox_id,
        request.headers.get("X-Session-API-Key"),
        request.match_info["conversation_id"],
        batch,
        verified=request.get(keys.WEBHOOK_SANDBOX) == sandbox_id,
        limiter=request.app.get(keys.WEBHOOK_LIMITER),
    )
    return json_response(Success())


@webhook_routes.route(
    "POST",
    "/api/v1/webhooks/{sandbox_id}/conversations",
    summary="Sandbox → control plane: a conversation's state (ConversationInfo)",
    public=True,
    body=ConversationInfoBody,
    response=Success,
    errors=(401, 404),
)
async def conversation_webhook(request: web.Request) -> web.Response:
    body = await parse_body(request, ConversationInfoBody)
    sandbox_id = request.match_info["sandbox_id"]
    await request.app[keys.EVENTS].ingest_info(
        sandbox_id,
        request.headers.get("X-Session-API-Key"),
        body.model_dump(mode="json"),
        verified=request.get(keys.WEBHOOK_SANDBOX) == sandbox_id,
    )
    return json_response(Success())
