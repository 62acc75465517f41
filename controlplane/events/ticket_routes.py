"""POST /api/v1/websocket-tickets: a short-lived, single-use ticket that opens one WebSocket (a
conversation's events socket, or one to a sandbox through the proxy) instead of a key in its URL
(controlplane/auth/tickets.py).

Here, in the highest domain that may read both conversations and sandboxes, because a ticket is
minted only for what the caller may open: its conversation (as the events socket allows), or
its own sandbox (as the proxy allows: the owner, never an admin for someone else's). Anyone
else's, or an id that does not exist, is a 404; the socket checks again when the ticket comes.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.auth.tickets import Ticket
from controlplane.conversations.models import Uuid
from controlplane.errors import RuntimeUnavailable, SandboxNotFound

routes = RouteTable(tag="events")


class TicketRequest(BaseModel):
    """Exactly one target."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: Uuid | None = Field(
        default=None, description="For /api/v1/events/socket of this conversation"
    )
    sandbox_id: str | None = Field(
        default=None,
        max_length=64,
        description="For a WebSocket to this sandbox through /sandboxes/{id}/proxy/{port}/…",
    )

    @model_validator(mode="after")
    def one_target(self) -> TicketRequest:
        if (self.conversation_id is None) == (self.sandbox_id is None):
            raise ValueError("give exactly one of conversation_id and sandbox_id")
        return self


@routes.route(
    "POST",
    "/api/v1/websocket-tickets",
    summary="A single-use ticket (30 s) that opens one WebSocket to your conversation's events "
    "or your sandbox, as `?acs_ticket=`, instead of a key in the URL",
    body=TicketRequest,
    response=Ticket,
    status=201,
    errors=(401, 404, 422),
)
async def mint_ticket(request: web.Request) -> web.Response:
    body = await parse_body(request, TicketRequest)
    principal = principal_of(request)
    tickets = request.app[keys.TICKETS]
    conversations, sandboxes = request.app.get(keys.CONVERSATIONS), request.app.get(keys.SANDBOXES)
    if conversations is None or sandboxes is None:
        raise RuntimeUnavailable("this control plane runs no sandboxes")
    if body.conversation_id is not None:
        info = await conversations.owned(principal, body.conversation_id)
        return json_response(await tickets.mint(principal, "conversation", info.id), status=201)
    assert body.sandbox_id is not None
    record = await sandboxes.owned(principal, body.sandbox_id)
    if record.owner != principal.user_id:  # as the proxy: the owner's alone
        raise SandboxNotFound(f"sandbox {body.sandbox_id} not found")
    return json_response(await tickets.mint(principal, "sandbox", record.id), status=201)
