"""Declarative routes: each endpoint carries the pydantic models the OpenAPI document is built from.

Handlers are registered through a RouteTable, so the document cannot drift from what is served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: Any = None
    """A pydantic model, or any type pydantic can describe (the events webhook's)."""
    body_optional: bool = False
    """An empty body means `{}` (parse_body(optional=True)): the document says it may be left
    out, so a client (or a fuzzer) that sends none is not told it broke the schema."""
    query: type[BaseModel] | None = None
    headers: type[BaseModel] | None = None
    """Request headers the route needs (by alias), for the document only."""
    response: Any = None
    status: int = 200
    public: bool = False
    errors: tuple[int, ...] = ()
    browser: bool = False
    """Also takes form posts and answers them with HTML pages or 303 redirects."""
    own_limits: bool = False
    """The handler bounds its own body size and time (a model call through the LLM gateway,
    larger and longer than any other request): the API's body limit and request time limit do
    not apply to it."""
    own_key_check: bool = False
    """A sandbox webhook whose handler checks the session key and the per-sandbox rate itself,
    in the same Redis round trip as its work (the events webhook): the webhook middleware leaves
    a small body's request to it (middlewares.py)."""


class RouteTable:
    """Collects endpoints of one resource group; `register` adds them to an application."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.endpoints: list[Endpoint] = []

    def route(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        body: Any = None,
        body_optional: bool = False,
        query: type[BaseModel] | None = None,
        headers: type[BaseModel] | None = None,
        response: Any = None,
        status: int = 200,
        public: bool = False,
        errors: tuple[int, ...] = (),
        browser: bool = False,
        own_limits: bool = False,
        own_key_check: bool = False,
    ) -> Callable[[Handler], Handler]:
        def decorate(handler: Handler) -> Handler:
            self.endpoints.append(
                Endpoint(
                    method=method,
                    path=path,
                    handler=handler,
                    summary=summary,
                    tag=self.tag,
                    body=body,
                    body_optional=body_optional,
                    query=query,
                    headers=headers,
                    response=response,
                    status=status,
                    public=public,
                    errors=errors,
                    browser=browser,
                    own_limits=own_limits,
                    own_key_check=own_key_check,
                )
            )
            if public:
                handler.acs_public = True  # type: ignore[attr-defined]  # a mark on the function object
            if own_limits:
                handler.acs_own_limits = True  # type: ignore[attr-defined]  # the same
            if own_key_check:
                handler.acs_own_key_check = True  # type: ignore[attr-defined]  # the same
            return handler

        return decorate

    def register(self, app: web.Application) -> None:
        for ep in self.endpoints:
            app.router.add_route(ep.method, ep.path, ep.handler)


def is_public(request: web.Request) -> bool:
    """True for routes declared public (and for unknown routes, which 404 anyway)."""
    match = request.match_info
    if match.http_exception is not None:
        return True
    return bool(getattr(match.handler, "acs_public", False))


def has_own_limits(request: web.Request) -> bool:
    """True for routes declared with `own_limits` (Endpoint.own_limits)."""
    match = request.match_info
    if match.http_exception is not None:
        return False
    return bool(getattr(match.handler, "acs_own_limits", False))


def has_own_key_check(request: web.Request) -> bool:
    """True for routes declared with `own_key_check` (Endpoint.own_key_check)."""
    match = request.match_info
    if match.http_exception is not None:
        return False
    return bool(getattr(match.handler, "acs_own_key_check", False))
