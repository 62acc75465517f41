"""/api/v1/conversations/{id}/pending-messages: the web frontend's queue for messages typed
while a conversation is starting or its socket is closed. The id is a conversation's, or
`task-<start task id>` before the conversation exists."""

from __future__ import annotations

from aiohttp import web

from controlplane.api.parsing import json_response, parse_body
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.conversations.handler_deps import conversation_service
from controlplane.conversations.pending import (
    DeliveryResult,
    PendingMessage,
    PendingMessageResponse,
    QueuePendingMessageRequest,
)
from controlplane.conversations.pending_access import PendingAccess

routes = RouteTable(tag="pending-messages")
BASE = "/api/v1/conversations/{conversation_id}/pending-messages"


def _access(request: web.Request) -> PendingAccess:
    return PendingAccess(conversation_service(request))


@routes.route(
    "POST",
    BASE,
    summary="Queue a message; it reaches the agent, in order and once, when the conversation runs",
    body=QueuePendingMessageRequest,
    response=PendingMessageResponse,
    status=201,
    errors=(404, 409, 429),
)
async def queue_message(request: web.Request) -> web.Response:
    body = await parse_body(request, QueuePendingMessageRequest)
    cid = request.match_info["conversation_id"]
    queued = await _access(request).queue(principal_of(request), cid, body)
    return json_response(queued, status=201)


@routes.route(
    "GET",
    BASE,
    summary="The messages still waiting, oldest first",
    response=list[PendingMessage],
    errors=(404, 409),
)
async def list_messages(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    return json_response(await _access(request).list(principal_of(request), cid))


@routes.route(
    "POST",
    f"{BASE}/deliver",
    summary="Deliver the waiting messages now if the conversation runs (after a reconnect)",
    response=DeliveryResult,
    errors=(404, 409),
)
async def deliver_messages(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    return json_response(await _access(request).deliver(principal_of(request), cid))
