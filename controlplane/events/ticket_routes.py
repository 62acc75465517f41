"""POST /api/v1/websocket-tickets: a short-lived, single-use ticket that opens one WebSocket (a
conversation's events socket, or one to a sandbox through the proxy) instead of a key in its URL
(controlplane/auth/tickets.py).

Here, in the highest domain that may read both conversations and sandboxes, because a ticket is
minted only for what the caller may open (EventService.conversation_ticket and sandbox_ticket):
its conversation (as the events socket allows), or its own sandbox (as the proxy allows: the
owner, never an admin for someone else's). Anyone else's, or an id that does not exist, is a
404; the socket checks again when the ticket comes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.auth.tickets import Ticket
from controlplane.conversations.models import Uuid
from controlplane.errors import RuntimeUnavailable

routes = RouteTable(tag="events")


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # null, which the field refuses: left out means "not this one"


class TicketRequest(BaseModel):
    """Exactly one target (the document says so with `oneOf`, so that a client generated from
    it, or a fuzzer, never sends both or neither)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["conversation_id"]}, {"required": ["sandbox_id"]}]
        },
    )

    conversation_id: Uuid | SkipJsonSchema[None] = Field(
        default=None,
        json_schema_extra=_no_default,
        description="For /api/v1/events/socket of this conversation",
    )
    sandbox_id: str | SkipJsonSchema[None] = Field(
        default=None,
        min_length=1,
        max_length=64,
        json_schema_extra=_no_default,
        description="For a WebSocket to this sandbox through /sandboxes/{id}/proxy/{port}/…",
    )

    @model_validator(mode="before")
    @classmethod
    def no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in ("conversation_id", "sandbox_id"):
                if name in data and data[name] is None:
                    raise ValueError(f"{name} may be left out, not null")
        return data

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
    events = request.app.get(keys.EVENTS)
    if events is None:
        raise RuntimeUnavailable("this control plane runs no sandboxes")
    principal = principal_of(request)
    if body.conversation_id is not None:
        ticket = await events.conversation_ticket(principal, body.conversation_id)
    else:
        assert body.sandbox_id is not None  # the model asks for exactly one
        ticket = await events.sandbox_ticket(principal, body.sandbox_id)
    return json_response(ticket, status=201)
