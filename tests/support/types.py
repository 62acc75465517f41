"""The type aliases of the tests, declared once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient

Client = TestClient[web.Request, web.Application]
"""An in-process client of one app (aiohttp_client)."""
ClientFactory = Callable[..., Awaitable[Client]]
"""make_client / make_sandbox_client: a client of an app made with configuration overrides."""
UserHeaders = Callable[..., Awaitable[dict[str, str]]]
"""user_headers: the headers carrying a new API key of a user (`admin=True` for an admin)."""
