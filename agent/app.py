"""The aiohttp application: ``create_app(config)``."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from . import __version__, files, shell
from .auth import auth_middleware
from .config import CONFIG_KEY, AgentConfig
from .conversations import routes as conversations
from .errors import ApiError, error_response

log = logging.getLogger(__name__)

__all__ = ["CONFIG_KEY", "create_app"]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error into JSON ``{"detail": ...}``; never leak a traceback."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.to_response()
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like pass through
            raise
        return error_response(exc.status, exc.reason)
    except Exception:
        log.exception("Unhandled error on %s %s", request.method, request.path)
        return error_response(500, "Internal server error")


async def health(_: web.Request) -> web.Response:
    return web.Response(text="OK")


async def alive(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def info(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    return web.json_response({"version": __version__, "workspace": str(config.workspace)})


def create_app(config: AgentConfig) -> web.Application:
    # Auth runs inside the error middleware so a 401 is plain JSON too.
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(config.api_keys)],
        client_max_size=16 * 1024 * 1024,
    )
    app[CONFIG_KEY] = config
    app.router.add_get("/health", health)
    app.router.add_get("/alive", alive)
    app.router.add_get("/api/info", info)
    shell.add_routes(app)
    files.add_routes(app)
    conversations.add_routes(app)
    return app
