"""HTTP routes of the conversations API (docs/agent-protocol.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from ..config import CONFIG_KEY
from ..errors import ApiError, parse_json_body
from .models import (
    ConfirmationResponse,
    SendMessageRequest,
    StartConversationRequest,
    normalize_conversation_id,
)
from .service import ConversationService, not_found

SERVICE_KEY = web.AppKey("conversations", ConversationService)
MAX_IDS = 100
MAX_PAGE = 100
SUCCESS = {"success": True}


def _service(request: web.Request) -> ConversationService:
    return request.app[SERVICE_KEY]


def _query_error(name: str, msg: str, kind: str = "value_error") -> ApiError:
    return ApiError(422, [{"loc": ["query", name], "msg": msg, "type": kind}])


def _conversation_id(request: web.Request) -> str:
    raw = request.match_info["conversation_id"]
    try:
        return normalize_conversation_id(raw)
    except ValueError:
        raise not_found(raw) from None


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


async def start_conversation(request: web.Request) -> web.Response:
    body = await parse_json_body(request, StartConversationRequest)
    conv, created = await _service(request).create(body)
    return _json(conv.info().model_dump(mode="json"), 201 if created else 200)


async def batch_get(request: web.Request) -> web.Response:
    ids = [i for raw in request.query.getall("ids", []) for i in raw.split(",") if i.strip()]
    if not 1 <= len(ids) <= MAX_IDS:
        raise _query_error("ids", f"give 1 to {MAX_IDS} conversation ids")
    service = _service(request)
    answer: list[Any] = []
    for raw in ids:
        try:
            conv = service.conversations.get(normalize_conversation_id(raw))
        except ValueError:
            conv = None
        answer.append(conv.info().model_dump(mode="json") if conv else None)
    return _json(answer)


async def search_conversations(request: web.Request) -> web.Response:
    """Every conversation, oldest first: ``{"items": [...], "next_page_id": id | null}``."""
    limit = _int_query(request, "limit", MAX_PAGE, 1, MAX_PAGE)
    ordered = sorted(_service(request).conversations.values(), key=lambda c: c.state.created_at)
    start = 0
    page_id = request.query.get("page_id")
    if page_id:
        positions = [i for i, c in enumerate(ordered) if c.id == page_id]
        if not positions:
            raise _query_error("page_id", f"Unknown page_id: {page_id}")
        start = positions[0]
    items = [c.info().model_dump(mode="json") for c in ordered[start : start + limit]]
    following = ordered[start + limit].id if start + limit < len(ordered) else None
    return _json({"items": items, "next_page_id": following})


async def count_conversations(request: web.Request) -> web.Response:
    return _json(len(_service(request).conversations))


async def get_conversation(request: web.Request) -> web.Response:
    conv = _service(request).get(_conversation_id(request))
    return _json(conv.info().model_dump(mode="json"))


async def send_message(request: web.Request) -> web.Response:
    service = _service(request)
    conv = service.get(_conversation_id(request))
    body = await parse_json_body(request, SendMessageRequest)
    service.send_message(conv, body)
    return _json(SUCCESS)


async def run(request: web.Request) -> web.Response:
    service = _service(request)
    service.run(service.get(_conversation_id(request)))
    return _json(SUCCESS)


async def pause(request: web.Request) -> web.Response:
    service = _service(request)
    service.pause(service.get(_conversation_id(request)))
    return _json(SUCCESS)


async def respond_to_confirmation(request: web.Request) -> web.Response:
    service = _service(request)
    conv = service.get(_conversation_id(request))
    body = await parse_json_body(request, ConfirmationResponse)
    service.respond(conv, body.accept, body.reason)
    return _json(SUCCESS)


async def delete_conversation(request: web.Request) -> web.Response:
    await _service(request).delete(_conversation_id(request))
    return _json(SUCCESS)


def _int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _query_error(name, "Input should be a valid integer", "int_parsing") from None
    if not low <= value <= high:
        raise _query_error(name, f"Input should be between {low} and {high}")
    return value


def _filtered_events(request: web.Request) -> list[dict[str, Any]]:
    conv = _service(request).get(_conversation_id(request))
    events = conv.events
    kind = request.query.get("kind")
    gte = request.query.get("timestamp__gte")
    lt = request.query.get("timestamp__lt")
    if kind or gte or lt:
        events = [
            e
            for e in events
            if (not kind or e["kind"] == kind)
            and (not gte or e["timestamp"] >= gte)
            and (not lt or e["timestamp"] < lt)
        ]
    return events


async def search_events(request: web.Request) -> web.Response:
    """``{"items": [...], "next_page_id": id | null}``; page_id is the first event's id."""
    limit = _int_query(request, "limit", MAX_PAGE, 1, MAX_PAGE)
    order = request.query.get("sort_order", "TIMESTAMP")
    if order not in ("TIMESTAMP", "TIMESTAMP_DESC"):
        raise _query_error("sort_order", "Input should be 'TIMESTAMP' or 'TIMESTAMP_DESC'")
    events = _filtered_events(request)
    if order == "TIMESTAMP_DESC":
        events = events[::-1]
    start = 0
    page_id = request.query.get("page_id")
    if page_id:
        positions = [i for i, e in enumerate(events) if e["id"] == page_id]
        if not positions:
            raise _query_error("page_id", f"Unknown page_id: {page_id}")
        start = positions[0]
    items = events[start : start + limit]
    following = events[start + limit] if start + limit < len(events) else None
    return _json({"items": items, "next_page_id": following["id"] if following else None})


async def count_events(request: web.Request) -> web.Response:
    return _json(len(_filtered_events(request)))


async def get_event(request: web.Request) -> web.Response:
    conv = _service(request).get(_conversation_id(request))
    event_id = request.match_info["event_id"]
    position = conv.event_index.get(event_id)
    if position is None:
        raise ApiError(404, f"Event not found: {event_id}")
    return _json(conv.events[position])


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE_KEY]
    await service.start()
    yield
    await service.close()


def add_routes(app: web.Application) -> None:
    app[SERVICE_KEY] = ConversationService(app[CONFIG_KEY])
    app.cleanup_ctx.append(_lifecycle)
    base = "/api/conversations"
    one = base + "/{conversation_id}"
    router = app.router
    router.add_post(base, start_conversation)
    router.add_get(base, batch_get)
    router.add_get(base + "/search", search_conversations)
    router.add_get(base + "/count", count_conversations)
    router.add_get(one, get_conversation)
    router.add_delete(one, delete_conversation)
    router.add_post(one + "/run", run)
    router.add_post(one + "/pause", pause)
    router.add_post(one + "/events", send_message)
    router.add_get(one + "/events/search", search_events)
    router.add_get(one + "/events/count", count_events)
    router.add_post(one + "/events/respond_to_confirmation", respond_to_confirmation)
    router.add_get(one + "/events/{event_id}", get_event)
