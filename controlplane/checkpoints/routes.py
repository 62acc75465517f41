"""A conversation's checkpoints, rewind and fork (docs/api.md#routes,
docs/sandboxes.md#checkpoints)."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.checkpoints.models import (
    CheckpointPage,
    CheckpointQuery,
    ForkConversationRequest,
    ForkConversationResult,
    RewindRequest,
    RewindResult,
)
from controlplane.checkpoints.service import CheckpointService
from controlplane.conversations.models import CONVERSATION_PARAM
from controlplane.errors import StoreUnavailable

routes = RouteTable(tag="checkpoints")
BASE = f"/api/v1/app-conversations/{CONVERSATION_PARAM}"


def _service(request: web.Request) -> CheckpointService:
    service = request.app.get(keys.CHECKPOINTS)
    if service is None:
        raise StoreUnavailable("checkpoints need snapshots: ACS_SNAPSHOT_STORE_URL is unset")
    return service


@routes.route(
    "GET",
    f"{BASE}/checkpoints",
    summary="The conversation's checkpoints (one at each user message), newest first",
    query=CheckpointQuery,
    response=CheckpointPage,
    errors=(404, 503),
)
async def list_checkpoints(request: web.Request) -> web.Response:
    query = parse_query(request, CheckpointQuery)
    cid = request.match_info["conversation_id"]
    return json_response(await _service(request).search(principal_of(request), cid, query))


@routes.route(
    "POST",
    f"{BASE}/rewind",
    summary="Bring the workspace and the agent's state back to a checkpoint; later events "
    "are kept, marked rewound_by",
    body=RewindRequest,
    response=RewindResult,
    errors=(404, 409, 429, 503),
)
async def rewind(request: web.Request) -> web.Response:
    body = await parse_body(request, RewindRequest)
    cid = request.match_info["conversation_id"]
    rewound = await _service(request).rewind(principal_of(request), cid, body.checkpoint_id)
    return json_response(rewound)


@routes.route(
    "POST",
    f"{BASE}/fork",
    summary="A new conversation in a new sandbox made from a checkpoint, with the history up "
    "to there",
    body=ForkConversationRequest,
    response=ForkConversationResult,
    errors=(404, 409, 429, 503),
)
async def fork(request: web.Request) -> web.Response:
    body = await parse_body(request, ForkConversationRequest)
    cid = request.match_info["conversation_id"]
    return json_response(await _service(request).fork(principal_of(request), cid, body))
