"""Turning request bodies and query strings into pydantic models, with 422s in one shape."""

from __future__ import annotations

import json
import re
import types
import typing
from datetime import datetime
from typing import Annotated, Any, TypeVar, get_args, get_origin

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ValidationError

M = TypeVar("M", bound=BaseModel)


class RequestValidationError(Exception):
    """Rendered as 422 `{"detail": [{"loc": [...], "msg": ..., "type": ...}]}`."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        super().__init__(items[0]["msg"] if items else "invalid request")
        self.items = items


_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def _not_a_number(value: Any) -> Any:
    # pydantic reads "0.5" as 1970-01-01T00:00:00.5: a typo would filter on 1970 silently.
    if isinstance(value, str) and _NUMBER.fullmatch(value):
        raise ValueError("must be an ISO 8601 date-time, not a number")
    return value


QueryTime = Annotated[datetime, BeforeValidator(_not_a_number)]
"""A date-time in a query string: ISO 8601 only (the OpenAPI `format: date-time`)."""


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
    data = load_json(raw)
    try:
        # Strict: JSON types are taken as sent. `false` is not 0, `"5"` is not 5 and `1` is not
        # true; a coercion there would change what the client meant (0 turns auto-pause off).
        return model.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as exc:
        raise RequestValidationError(error_items(exc, "body")) from None


def _number(text: str) -> float | int:
    # 487.0 is an integer to JSON Schema; to strict pydantic only 487 is. Whole floats become
    # ints (float fields take ints), so an integer field accepts both spellings.
    value = float(text)
    return int(value) if value.is_integer() else value


def load_json(raw: bytes) -> Any:
    """The parsed body, or a 422 saying where the JSON is broken."""
    try:
        return json.loads(raw, parse_float=_number)
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
    except ValueError as exc:
        # Python refuses integers over 4,300 digits (sys.int_info.default_max_str_digits).
        raise invalid("body", msg=f"JSON decode error: {exc}", error_type="json_invalid") from None


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
    elif isinstance(payload, list) and all(v is None or isinstance(v, BaseModel) for v in payload):
        # A batch GET's answer (polled every few ms): each model serialised by pydantic, as a
        # lone one is, instead of dumped to Python objects and encoded again by json.dumps.
        text = "[" + ",".join("null" if v is None else v.model_dump_json() for v in payload) + "]"
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
