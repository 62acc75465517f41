"""Query parameters of the conversation and event listings, checked as the official server does
(FastAPI-style 422 ``detail`` lists)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiohttp import web

from ..errors import ApiError

T = TypeVar("T")
MAX_PAGE = 100


def query_error(name: str, msg: str, kind: str = "value_error") -> ApiError:
    return ApiError(422, [{"loc": ["query", name], "msg": msg, "type": kind}])


def int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise query_error(name, "Input should be a valid integer", "int_parsing") from None
    if not low <= value <= high:
        raise query_error(name, f"Input should be between {low} and {high}")
    return value


def choice_query(request: web.Request, name: str, default: str, choices: Sequence[str]) -> str:
    value = request.query.get(name) or default
    if value not in choices:
        listed = ", ".join(f"'{c}'" for c in choices)
        raise query_error(name, f"Input should be one of {listed}", "enum")
    return value


def naive_utc(value: datetime) -> datetime:
    """Event timestamps are naive UTC: aware values are converted, naive ones taken as UTC."""
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


def time_query(request: web.Request, name: str) -> datetime | None:
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        return naive_utc(datetime.fromisoformat(raw.replace(" ", "+")))
    except ValueError:
        raise query_error(name, "Input should be a valid datetime", "datetime_parsing") from None


def event_time(event: dict[str, Any]) -> datetime | None:
    try:
        return naive_utc(datetime.fromisoformat(str(event.get("timestamp", ""))))
    except ValueError:
        return None


def page(
    items: list[T], request: web.Request, key: Callable[[T], str]
) -> tuple[list[T], str | None]:
    """``limit`` items from the one whose key is ``page_id``; the next page's first key."""
    limit = int_query(request, "limit", MAX_PAGE, 1, MAX_PAGE)
    start = 0
    page_id = request.query.get("page_id")
    if page_id:
        positions = [i for i, item in enumerate(items) if key(item) == page_id]
        if not positions:
            raise query_error("page_id", f"Unknown page_id: {page_id}")
        start = positions[0]
    chunk = items[start : start + limit]
    following = key(items[start + limit]) if start + limit < len(items) else None
    return chunk, following


def message_text(event: dict[str, Any]) -> str:
    parts = [*event.get("llm_message", {}).get("content", []), *event.get("extended_content", [])]
    return " ".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def event_filter(request: web.Request) -> Callable[[dict[str, Any]], bool] | None:
    """The ``kind``, ``source``, ``body`` and timestamp filters; None when there are none."""
    kind = request.query.get("kind") or request.query.get("kind__eq")
    source = request.query.get("source")
    body = (request.query.get("body") or "").lower()
    gte = time_query(request, "timestamp__gte")
    lt = time_query(request, "timestamp__lt")
    if not (kind or source or body or gte or lt):
        return None

    def matches(event: dict[str, Any]) -> bool:
        if kind and event.get("kind") != kind:
            return False
        if source and event.get("source") != source:
            return False
        if body and (
            event.get("kind") != "MessageEvent" or body not in message_text(event).lower()
        ):
            return False
        if gte or lt:
            when = event_time(event)
            if when is None or (gte and when < gte) or (lt and when >= lt):
                return False
        return True

    return matches
