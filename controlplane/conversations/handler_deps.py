"""What the conversation route tables take from a request: the service, or a 503 saying why."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.conversations.service import ConversationService
from controlplane.errors import RuntimeUnavailable


def conversation_service(request: web.Request) -> ConversationService:
    """The app's ConversationService. Raises RuntimeUnavailable on a server without sandboxes."""
    service = request.app.get(keys.CONVERSATIONS)
    if service is None:
        raise RuntimeUnavailable("conversations are not enabled on this server")
    return service
