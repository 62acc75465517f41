"""HTTP routes of the conversations API (docs/agent-protocol.md)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..errors import ApiError
from ..validation import parse_json_body
from . import extras, sockets
from .conversation import Conversation
from .models import (
    ConfirmationResponse,
    ExecutionStatus,
    SendMessageRequest,
    StartConversationRequest,
    dashed,
    normalize_conversation_id,
)
from .mount import BASE, CONVERSATIONS, ONE, SOCKET, Handler
from .queries import MAX_PAGE, choice_query, event_filter, page, query_error
from .service import ConversationService, not_found

MAX_IDS = 99
SUCCESS = {"success": True}
SORTS = {
    "CREATED_AT": ("created_at", False),
    "CREATED_AT_DESC": ("created_at", True),
    "UPDATED_AT": ("updated_at", False),
    "UPDATED_AT_DESC": ("updated_at", True),
}


def service_of(request: web.Request) -> ConversationService:
    return request.app[CONVERSATIONS].service


def conversation_of(request: web.Request) -> Conversation:
    raw = request.match_info["conversation_id"]
    try:
        conversation_id = normalize_conversation_id(raw)
    except ValueError:
        raise not_found(raw) from None
    return service_of(request).get(conversation_id)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


async def start_conversation(request: web.Request) -> web.Response:
    body = await parse_json_body(request, StartConversationRequest)
    conv, created = await service_of(request).create(body)
    return _json(conv.info(), 201 if created else 200)


async def batch_get(request: web.Request) -> web.Response:
    ids = [i for raw in request.query.getall("ids", []) for i in raw.split(",") if i.strip()]
    if not 1 <= len(ids) <= MAX_IDS:
        raise query_error("ids", f"give 1 to {MAX_IDS} conversation ids")
    service = service_of(request)
    answer: list[Any] = []
    for raw in ids:
        try:
            conv = service.conversations.get(normalize_conversation_id(raw))
        except ValueError:
            conv = None
        answer.append(conv.info() if conv else None)
    return _json(answer)


def _status_filter(request: web.Request) -> list[Conversation]:
    conversations = list(service_of(request).conversations.values())
    status = request.query.get("status")
    if status:
        choice_query(request, "status", "", [s.value for s in ExecutionStatus])
        conversations = [c for c in conversations if c.status.value == status]
    return conversations


async def search_conversations(request: web.Request) -> web.Response:
    """``{"items": [...], "next_page_id": id | null}``; newest first by default."""
    order = choice_query(request, "sort_order", "CREATED_AT_DESC", list(SORTS))
    field, reverse = SORTS[order]
    ordered = sorted(
        _status_filter(request), key=lambda c: (getattr(c.state, field), c.id), reverse=reverse
    )
    chunk, following = page(ordered, request, lambda c: dashed(c.id))
    return _json({"items": [c.info() for c in chunk], "next_page_id": following})


async def count_conversations(request: web.Request) -> web.Response:
    return _json(len(_status_filter(request)))


async def get_conversation(request: web.Request) -> web.Response:
    return _json(conversation_of(request).info())


async def send_message(request: web.Request) -> web.Response:
    conv = conversation_of(request)
    body = await parse_json_body(request, SendMessageRequest)
    service_of(request).send_message(conv, body)
    return _json(SUCCESS)


async def run(request: web.Request) -> web.Response:
    service_of(request).run(conversation_of(request))
    return _json(SUCCESS)


async def pause(request: web.Request) -> web.Response:
    service_of(request).pause(conversation_of(request))
    return _json(SUCCESS)


async def interrupt(request: web.Request) -> web.Response:
    await service_of(request).interrupt(conversation_of(request))
    return _json(SUCCESS)


async def respond_to_confirmation(request: web.Request) -> web.Response:
    conv = conversation_of(request)
    body = await parse_json_body(request, ConfirmationResponse)
    service_of(request).respond(conv, body.accept, body.reason)
    return _json(SUCCESS)


async def delete_conversation(request: web.Request) -> web.Response:
    await service_of(request).delete(conversation_of(request).id)
    return _json(SUCCESS)


def filtered_events(conv: Conversation, request: web.Request) -> list[dict[str, Any]]:
    matches = event_filter(request)
    return conv.events if matches is None else [e for e in conv.events if matches(e)]


async def search_events(request: web.Request) -> web.Response:
    """``{"items": [...], "next_page_id": id | null}``; page_id is the first event's id."""
    conv = conversation_of(request)
    order = choice_query(request, "sort_order", "TIMESTAMP", ["TIMESTAMP", "TIMESTAMP_DESC"])
    events = filtered_events(conv, request)
    if order == "TIMESTAMP_DESC":
        events = events[::-1]
    chunk, following = page(events, request, lambda e: str(e["id"]))
    return _json({"items": chunk, "next_page_id": following})


async def count_events(request: web.Request) -> web.Response:
    return _json(len(filtered_events(conversation_of(request), request)))


async def get_event(request: web.Request) -> web.Response:
    conv = conversation_of(request)
    event_id = request.match_info["event_id"]
    position = conv.event_index.get(event_id)
    if position is None:
        raise ApiError(404, f"Event not found: {event_id}")
    return _json(conv.events[position])


async def batch_get_events(request: web.Request) -> web.Response:
    conv = conversation_of(request)
    ids = request.query.getall("event_ids", [])
    if len(ids) > MAX_PAGE:
        raise query_error("event_ids", f"give at most {MAX_PAGE} event ids")
    positions = [conv.event_index.get(i) for i in ids]
    return _json([conv.events[p] if p is not None else None for p in positions])


def handlers() -> dict[str, Handler]:
    """Every route's handler, keyed "METHOD path" as :data:`mount.ROUTES` lists them (mount.py
    registers the routes at boot and loads this module at their first call)."""
    table: dict[str, Handler] = {
        f"POST {BASE}": start_conversation,
        f"GET {BASE}": batch_get,
        f"GET {BASE}/search": search_conversations,
        f"GET {BASE}/count": count_conversations,
        f"GET {ONE}": get_conversation,
        f"DELETE {ONE}": delete_conversation,
        f"POST {ONE}/run": run,
        f"POST {ONE}/pause": pause,
        f"POST {ONE}/interrupt": interrupt,
        f"POST {ONE}/events": send_message,
        f"GET {ONE}/events": batch_get_events,
        f"GET {ONE}/events/search": search_events,
        f"GET {ONE}/events/count": count_events,
        f"POST {ONE}/events/respond_to_confirmation": respond_to_confirmation,
        f"GET {ONE}/events/{{event_id}}": get_event,
        f"GET {SOCKET}": sockets.make_handler(service_of),
    }
    for route, handler in extras.make_routes(conversation_of).items():
        method, suffix = route.split(" ", 1)
        table[f"{method} {ONE}{suffix}"] = handler
    return table
