"""JSON error responses shared by all routes.

Every error leaves the server as JSON: ``{"detail": "message"}``, or for an
invalid request body (HTTP 422) the pydantic/FastAPI-style list
``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}`` (bodies are read and checked by
:mod:`agent.bodies`). No pydantic here: every route imports this module, and the server
answers ``/health`` and its first command without pydantic (agent/README.md, "Boot").
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


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


def missing_query(name: str) -> ApiError:
    """The 422 of a required query parameter that was not given."""
    return ApiError(422, [{"loc": ["query", name], "msg": "Field required", "type": "missing"}])
