"""JSON error responses shared by all routes.

Every error leaves the server as JSON: ``{"detail": "message"}``, or for an
invalid request body (HTTP 422) the pydantic/FastAPI-style list
``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


def error_response(status: int, detail: Any) -> web.Response:
    return web.json_response({"detail": detail}, status=status)


class ApiError(Exception):
    """Raise from a handler to answer ``{"detail": detail}`` with ``status``."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail

    def to_response(self) -> web.Response:
        return error_response(self.status, self.detail)


def validation_detail(exc: ValidationError, prefix: str = "body") -> list[dict[str, Any]]:
    """Turn a pydantic error into the ``detail`` list of a 422 response."""
    return [
        {
            "loc": [prefix, *(str(part) for part in err["loc"])],
            "msg": err["msg"],
            "type": err["type"],
        }
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


async def parse_json_body(request: web.Request, model: type[ModelT]) -> ModelT:
    """Parse and validate a JSON request body, raising a 422 ApiError on failure."""
    raw = await request.read()
    try:
        data = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(
            422,
            [{"loc": ["body"], "msg": f"Invalid JSON: {exc}", "type": "json_invalid"}],
        ) from exc
    if data is None:
        raise ApiError(422, [{"loc": ["body"], "msg": "Field required", "type": "missing"}])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, validation_detail(exc)) from exc


def missing_query(name: str) -> ApiError:
    """The 422 of a required query parameter that was not given."""
    return ApiError(422, [{"loc": ["query", name], "msg": "Field required", "type": "missing"}])
