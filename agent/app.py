"""The aiohttp application: ``create_app(config)``."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from . import __version__, bash_routes, files, git, refusals
from .auth import auth_middleware
from .config import CONFIG_KEY, AgentConfig
from .conversations import mount as conversations
from .conversations.tool_specs import KINDS
from .cors import cors_middleware
from .errors import ApiError, error_response
from .shell import pidfd_child_watcher

log = logging.getLogger(__name__)

__all__ = ["CONFIG_KEY", "create_app"]

#: The wire contract this server speaks (docs/agent-protocol.md).
PROTOCOL = "openhands-agent-server 1.58"
STARTED = web.AppKey("started", float)
LAST_ACTIVITY = web.AppKey("last_activity", list[float])


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


@web.middleware
async def activity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Notes the time of the last API call (``idle_time`` in /server_info)."""
    if request.path.startswith(("/api/", "/sockets/")):
        request.app[LAST_ACTIVITY][0] = time.time()
    return await handler(request)


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(_: web.Request) -> web.Response:
    return web.json_response({"status": "ready"})


async def info(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    return web.json_response({"version": __version__, "workspace": str(config.workspace)})


async def server_info(request: web.Request) -> web.Response:
    now = time.time()
    return web.json_response(
        {
            "uptime": int(now - request.app[STARTED]),
            "idle_time": int(now - request.app[LAST_ACTIVITY][0]),
            "title": "ACS agent server",
            "version": __version__,
            "protocol": PROTOCOL,
            "python_version": sys.version,
            "usable_tools": list(KINDS),
            "conversation_runtime": "local",
            "available_conversation_runtimes": [],
            "capabilities": ["idempotent_conversation_create_v1"],
            "docs": "/docs",
        }
    )


async def vscode_url(_: web.Request) -> web.Response:
    raise ApiError(503, "VSCode is not available in this sandbox")


async def vscode_status(_: web.Request) -> web.Response:
    return web.json_response({"running": False, "enabled": False})


async def _child_watcher(_: web.Application) -> AsyncIterator[None]:
    async with pidfd_child_watcher():
        yield


def create_app(config: AgentConfig) -> web.Application:
    # Auth runs inside the error middleware so a 401 is plain JSON too; CORS outside both so
    # that even a 401 reaches the browser's script.
    app = web.Application(
        middlewares=[
            cors_middleware(config.cors_origins),
            error_middleware,
            activity_middleware,
            auth_middleware(config.api_keys),
        ],
        client_max_size=16 * 1024 * 1024,
    )
    app[CONFIG_KEY] = config
    app.cleanup_ctx.append(_child_watcher)
    app[STARTED] = time.time()
    app[LAST_ACTIVITY] = [time.time()]
    router = app.router
    router.add_get("/health", health)
    router.add_get("/alive", health)
    router.add_get("/ready", ready)
    router.add_get("/server_info", server_info)
    router.add_get("/api/info", info)
    router.add_get("/api/vscode/url", vscode_url)
    router.add_get("/api/vscode/status", vscode_status)
    bash_routes.add_routes(app)
    files.add_routes(app)
    git.add_routes(app)
    conversations.add_routes(app)
    refusals.add_routes(app)
    return app
