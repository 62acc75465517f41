"""Turning request bodies and query strings into pydantic models, with 422s in one shape."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, TypeVar, get_args, get_origin

from aiohttp import web
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class RequestValidationError(Exception):
    """Rendered as 422 `{"detail": [{"loc": [...], "msg": ..., "type": ...}]}`."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        super().__init__(items[0]["msg"] if items else "invalid request")
        self.items = items


def error_items(exc: ValidationError, source: str) -> list[dict[str, Any]]:
    """pydantic errors as the documented list; `loc` items are always strings."""
    return [
        {
            "loc": [source, *(str(part) for part in err["loc"])],
            "msg": err["msg"],
            "type": err["type"],
        }
        for err in exc.errors(include_url=False)
    ]


def invalid(source: str, *loc: str, msg: str, error_type: str) -> RequestValidationError:
    return RequestValidationError([{"loc": [source, *loc], "msg": msg, "type": error_type}])


async def parse_body(request: web.Request, model: type[M], *, optional: bool = False) -> M:
    """Parse a JSON body into `model`. With optional=True an empty body means `{}`."""
    raw = await request.read()
    if not raw.strip():
        if optional:
            return model.model_validate({})
        raise invalid("body", msg="Field required", error_type="missing")
    if request.content_type not in ("application/json", "application/octet-stream", ""):
        raise invalid(
            "header",
            "content-type",
            msg=f"Content-Type must be application/json, not {request.content_type}",
            error_type="content_type",
        )
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        pos = str(getattr(exc, "pos", 0))
        raise invalid(
            "body", pos, msg=f"JSON decode error: {exc}", error_type="json_invalid"
        ) from None
    except RecursionError:
        # A body of a few KB of "[[[[..." is the client's error, not a 500.
        raise invalid(
            "body", msg="JSON decode error: nested too deeply", error_type="json_invalid"
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(error_items(exc, "body")) from None


def _is_list(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin in (list, tuple, set):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_list(arg) for arg in get_args(annotation))
    return False


def parse_query(request: web.Request, model: type[M]) -> M:
    """Parse the query string into `model`; list fields take repeated parameters."""
    query = request.query
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in query:
            continue
        data[name] = query.getall(key) if _is_list(info.annotation) else query[key]
    unknown = sorted(set(query) - {info.alias or name for name, info in model.model_fields.items()})
    if unknown and model.model_config.get("extra") == "forbid":
        raise invalid(
            "query", unknown[0], msg="Unknown query parameter", error_type="extra_forbidden"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(error_items(exc, "query")) from None


def json_response(payload: Any, status: int = 200) -> web.Response:
    """Serialise a model, a list of models or plain JSON data."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    else:
        text = json.dumps(_plain(payload))
    return web.Response(text=text, status=status, content_type="application/json")


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
