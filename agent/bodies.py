"""A request's JSON body, or the 422 of one that is missing or not JSON.

Without pydantic (see :mod:`agent.validation` for the models' checks): the bash routes read
their bodies with it, and the server answers its first command without pydantic
(agent/README.md, "Boot").
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .errors import ApiError


async def read_json_body(request: web.Request) -> Any:
    """The body's JSON value; a 422 ApiError when there is none or it is not JSON."""
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
    return data
