"""The conversations API, served from the start, its code loaded at its first use.

The conversations' code (pydantic and the request models, the loop, the LLM client, the tools)
was about a fifth of the agent server's boot CPU, which a burst of cold starts pays per sandbox
on shared cores; a sandbox answers ``/health`` and its first commands without it. So the routes
are registered at boot, each with a handler that first makes sure the code is loaded: the first
request imports :mod:`agent.conversations.routes`, makes the
:class:`~agent.conversations.service.ConversationService` and starts it, once; then every request
goes straight on to its handler. The import runs on the loop (70-90 ms of CPU, once): in a thread
it could race an import of pydantic's by a bash request's model on the loop (the import system's
module locks then raise on a cycle rather than wait), for a pause the warm pool's members never
show their users (the pool loads it before a claim: controlplane/agent_protocol/kinds.py).

Where the state directory holds conversations (a restarted server), that happens at start-up
instead, as before: they are restored before the first request is served.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from ..config import CONFIG_KEY, AgentConfig
from .persistence import conversations_root

if TYPE_CHECKING:
    from .service import ConversationService

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OpenSockets = weakref.WeakSet[web.WebSocketResponse]

BASE = "/api/conversations"
ONE = BASE + "/{conversation_id}"
SOCKET = "/sockets/events/{conversation_id}"
CLOSE_AWAY = 1001
#: Every route of the conversations API, "METHOD path": what :func:`routes.handlers` answers.
ROUTES = (
    f"POST {BASE}",
    f"GET {BASE}",
    f"GET {BASE}/search",
    f"GET {BASE}/count",
    f"GET {ONE}",
    f"DELETE {ONE}",
    f"PATCH {ONE}",
    f"POST {ONE}/run",
    f"POST {ONE}/pause",
    f"POST {ONE}/interrupt",
    f"POST {ONE}/events",
    f"GET {ONE}/events",
    f"GET {ONE}/events/search",
    f"GET {ONE}/events/count",
    f"POST {ONE}/events/respond_to_confirmation",
    f"GET {ONE}/events/{{event_id}}",
    f"POST {ONE}/secrets",
    f"POST {ONE}/confirmation_policy",
    f"POST {ONE}/security_analyzer",
    f"POST {ONE}/ask_agent",
    f"POST {ONE}/generate_title",
    f"GET {ONE}/agent_final_response",
    f"POST {ONE}/condense",
    f"POST {ONE}/load_plugin",
    f"POST {ONE}/navigate",
    f"GET {SOCKET}",
)


class Conversations:
    """The conversations' code and service of one server, loaded once (:meth:`handlers`)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        #: The live event sockets, closed when the server shuts down.
        self.sockets: OpenSockets = weakref.WeakSet()
        self._service: ConversationService | None = None
        self._handlers: dict[str, Handler] | None = None
        self._lock = asyncio.Lock()

    @property
    def service(self) -> ConversationService:
        """The started service; RuntimeError before the code is loaded (no conversations
        handler runs before that)."""
        if self._service is None:
            raise RuntimeError("the conversations' code is not loaded yet")
        return self._service

    @property
    def loaded(self) -> bool:
        return self._handlers is not None

    def stored(self) -> bool:
        """Whether the state directory holds conversations (or a fork's carried history)."""
        if self.config.state_dir is None:
            return False
        try:
            return any(conversations_root(self.config.state_dir).iterdir())
        except OSError:  # none stored yet, or unreadable: the service's restore says which
            return False

    async def handlers(self) -> dict[str, Handler]:
        """Every route's handler, keyed as :data:`ROUTES`; loads the code and starts the
        service the first time (concurrent first calls wait for the one load)."""
        if self._handlers is not None:
            return self._handlers
        async with self._lock:
            if self._handlers is None:
                service_class, handlers_of = _import_code()
                service = service_class(self.config)
                await service.start()
                self._service = service
                handlers = handlers_of()
                if set(handlers) != set(ROUTES):  # a route added on one side only
                    raise RuntimeError(f"routes differ: {sorted(set(handlers) ^ set(ROUTES))}")
                self._handlers = handlers
            return self._handlers

    async def close(self) -> None:
        """Stops the service, if it was started (after a load in progress)."""
        async with self._lock:
            if self._service is not None:
                await self._service.close()
                self._service = None


CONVERSATIONS = web.AppKey("conversations", Conversations)


def _import_code() -> tuple[type[ConversationService], Callable[[], dict[str, Handler]]]:
    """The conversations' code: imported here, at the first use, not at boot (the module's
    point)."""
    from .routes import handlers  # noqa: PLC0415
    from .service import ConversationService  # noqa: PLC0415

    return ConversationService, handlers


def _deferred(route: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        handlers = await request.app[CONVERSATIONS].handlers()
        return await handlers[route](request)

    return handler


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    conversations = app[CONVERSATIONS]
    if conversations.stored():  # restored before the first request is served, as before
        await conversations.handlers()
    yield
    await conversations.close()


async def _close_sockets(app: web.Application) -> None:
    for ws in list(app[CONVERSATIONS].sockets):
        await ws.close(code=CLOSE_AWAY, message=b"server shutting down")


def add_routes(app: web.Application) -> None:
    """Registers every route of :data:`ROUTES`; the code behind them loads at the first call."""
    app[CONVERSATIONS] = Conversations(app[CONFIG_KEY])
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_close_sockets)
    for route in ROUTES:
        method, path = route.split(" ", 1)
        if method == "GET":
            app.router.add_get(path, _deferred(route))
        else:
            app.router.add_route(method, path, _deferred(route))
