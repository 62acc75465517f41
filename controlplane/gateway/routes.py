"""The LLM gateway's routes (docs/llm-gateway.md).

`sandbox_routes`, under /api/v1/llm-gateway (with and without `/v1`), speak OpenAI's protocol and
take a gateway credential (a sandbox token or a user gateway key) as `Authorization: Bearer`,
`api-key` or `x-api-key`, never an API key of the control plane; they are served by the API
and by the webhook listener, the one host service sandboxes reach. `routes` (API only, API key)
manage the user's gateway key and read the metered usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import Handler, RouteTable
from controlplane.auth.identity import PRINCIPAL, principal_of
from controlplane.auth.models import USER_ID_PATTERN, Principal
from controlplane.errors import NotFound
from controlplane.gateway.agent_llm import PATH as PREFIX
from controlplane.gateway.calls import AdmittedCall
from controlplane.gateway.credentials import Caller
from controlplane.gateway.forward import GatewayError
from controlplane.gateway.service import GatewayService
from controlplane.organizations.models import OrgLlmUsage
from controlplane.organizations.roles import Action

sandbox_routes = RouteTable(tag="llm-gateway")
routes = RouteTable(tag="llm-gateway")


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat-completions request; every field it defines is forwarded as sent."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(max_length=256)
    messages: list[dict[str, Any]]
    stream: bool = False


class ModelEntry(BaseModel):
    id: str
    object: str = "model"
    owned_by: str = "acs-llm-gateway"


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelEntry]


class GatewayErrorBody(BaseModel):
    error: dict[str, Any]


class UsageView(BaseModel):
    month: str
    cost: float
    prompt_tokens: int
    completion_tokens: int
    requests: int
    monthly_budget: float | None = Field(description="ACS_LLM_USER_MONTHLY_BUDGET; null: none")


class ConversationUsageView(BaseModel):
    conversation_id: str
    cost: float
    prompt_tokens: int
    completion_tokens: int
    requests: int


class UsageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    user_id: str | None = Field(
        default=None,
        pattern=USER_ID_PATTERN,
        description="Another member's month (owners, admins and auditors of the organization "
        "acted in)",
    )


class GatewayKey(BaseModel):
    key: str = Field(description="The user's LLM gateway key (acs-llm.…)")


def _credential(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("api-key") or request.headers.get("x-api-key")


def _gateway_error(exc: GatewayError) -> web.Response:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return web.json_response(exc.body(), status=exc.status, headers=headers)


async def _read_body(request: web.Request, limit: int) -> tuple[dict[str, Any], bytes]:
    """The request as a dict and as sent (forwarded unchanged when nothing needs changing).
    Checked only as far as the gateway needs (an object with a model and messages): the
    provider validates the rest, as it would if called directly."""
    if request.content_length is not None and request.content_length > limit:
        raise GatewayError(413, "request_too_large", f"the body is larger than {limit} bytes")
    data = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > limit:
            raise GatewayError(413, "request_too_large", f"the body is larger than {limit} bytes")
    raw = bytes(data)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError(400, "invalid_request", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "invalid_request", "the body is not a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= 256:
        raise GatewayError(400, "invalid_request", "model: a string of 1 to 256 characters")
    if not isinstance(body.get("messages"), list):
        raise GatewayError(400, "invalid_request", "messages: a list is required")
    if not isinstance(body.get("stream", False), bool):
        raise GatewayError(400, "invalid_request", "stream: a boolean")
    return body, raw


def _mark(request: web.Request, caller: Caller) -> None:
    """The request is authenticated (no pacing) and its log line names the user."""
    request[PRINCIPAL] = Principal(user_id=caller.user_id, key_id=f"llm-gateway:{caller.label}")


def _gateway(request: web.Request) -> GatewayService:
    gateway = request.app.get(keys.GATEWAY)
    if gateway is None:
        raise GatewayError(503, "gateway_unavailable", "the LLM gateway is not running")
    return gateway


async def chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        gateway = _gateway(request)
        # The gateway reads the body (_read_body) once the credential can be genuine.
        call = await gateway.call(_credential(request), functools.partial(_read_body, request))
        _mark(request, call.caller)
        answer = await call.answer()
    except GatewayError as exc:
        return _gateway_error(exc)
    if isinstance(answer, bytes):
        return web.Response(body=answer, content_type="application/json")
    return await _stream(request, call, answer)


async def _stream(
    request: web.Request, call: AdmittedCall, events: AsyncIterator[bytes]
) -> web.StreamResponse:
    """The provider's stream relayed as it comes; settled with how it ended (499: the client
    went away)."""
    out = _EventStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    status = 200
    headers_alone = None
    try:
        await out.prepare(request)
        headers_alone = asyncio.get_running_loop().call_later(HEADERS_GRACE, _send_headers, request)
        async for chunk in events:
            await out.write(chunk)
        await out.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        status = 499  # the client went away
        raise
    finally:
        if headers_alone is not None:
            headers_alone.cancel()
        call.settle(status)
    return out


HEADERS_GRACE = 0.05
"""How long a stream's headers wait for its first event to go out with it."""


class _EventStream(web.StreamResponse):
    """A stream whose headers go out with its first event, in one write (one wake-up of the
    client, on the path of its first token), or alone after HEADERS_GRACE when the provider is
    slower (`_send_headers`), as a direct call's would. (aiohttp's StreamResponse sends them
    at `prepare`; its Response, not at all until the body: this flag is what differs.)"""

    _send_headers_immediately = False


def _send_headers(request: web.Request) -> None:
    with contextlib.suppress(ConnectionError):  # the client left meanwhile
        request.writer.send_headers()


async def list_models(request: web.Request) -> web.Response:
    try:
        configured = await _gateway(request).configured_model(_credential(request))
    except GatewayError as exc:
        return _gateway_error(exc)
    _mark(request, configured.caller)
    model = configured.model
    return json_response(ModelList(data=[ModelEntry(id=model)] if model else []))


async def model_info(request: web.Request) -> web.Response:
    """LiteLLM proxy's /v1/model/info, which OpenHands' SDK reads for `litellm_proxy/` models."""
    try:
        configured = await _gateway(request).configured_model(_credential(request))
    except GatewayError as exc:
        return _gateway_error(exc)
    _mark(request, configured.caller)
    data = []
    if model := configured.model:
        provider = model.partition("/")[0] if "/" in model else None
        info: dict[str, Any] = {"litellm_provider": provider}
        if configured.price is not None:
            info["input_cost_per_token"], info["output_cost_per_token"] = configured.price
        data.append({"model_name": model, "litellm_params": {"model": model}, "model_info": info})
    return web.json_response({"data": data})


def _alias(handler: Handler, suffix: str) -> Handler:
    """The same handler under a second path (its own name: OpenAPI operation ids are unique)."""

    async def alias(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    alias.__name__ = f"{handler.__name__}_{suffix}"
    return alias


# Served with and without `/v1`: OpenAI's clients append paths to a base ending in /v1,
# LiteLLM proxy clients (OpenHands' SDK: `{base}/v1/model/info`) to the root.
for _base, _suffix in ((f"{PREFIX}/v1", ""), (PREFIX, "root")):
    sandbox_routes.route(
        "POST",
        f"{_base}/chat/completions",
        summary="OpenAI chat completions through the gateway (gateway credential)",
        body=ChatCompletionRequest,
        response=dict[str, Any],
        public=True,
        errors=(400, 401, 404, 413, 429, 502, 503, 504),
        own_limits=True,  # ACS_LLM_GATEWAY_MAX_BODY_BYTES and ACS_LLM_GATEWAY_TIMEOUT
    )(_alias(chat_completions, _suffix) if _suffix else chat_completions)
    sandbox_routes.route(
        "GET",
        f"{_base}/models",
        summary="The model this gateway credential may call",
        response=ModelList,
        public=True,
        errors=(401,),
    )(_alias(list_models, _suffix) if _suffix else list_models)
    sandbox_routes.route(
        "GET",
        f"{_base}/model/info",
        summary="LiteLLM proxy's model info for that model (what OpenHands' SDK reads)",
        response=dict[str, Any],
        public=True,
        errors=(401,),
    )(_alias(model_info, _suffix) if _suffix else model_info)


@routes.route(
    "POST",
    "/api/keys/llm/byor/refresh",
    summary="Replace the caller's LLM gateway key; the previous one stops working at once",
    response=GatewayKey,
)
async def refresh_key(request: web.Request) -> web.Response:
    key = await request.app[keys.GATEWAY].rotate_key(principal_of(request).user_id)
    return json_response(GatewayKey(key=key))


@routes.route(
    "DELETE",
    "/api/keys/llm/byor",
    summary="Revoke the caller's LLM gateway key at once",
    status=204,
    errors=(404,),
)
async def revoke_key(request: web.Request) -> web.Response:
    if not await request.app[keys.GATEWAY].revoke_key(principal_of(request).user_id):
        raise NotFound("no LLM gateway key to revoke")
    return web.Response(status=204)


@routes.route(
    "GET",
    "/api/v1/llm-gateway/usage",
    summary="What the gateway metered for the caller this month (or for one conversation)",
    query=UsageQuery,
    response=UsageView | ConversationUsageView,
    errors=(403, 404),
)
async def usage(request: web.Request) -> web.Response:
    gateway = request.app[keys.GATEWAY]
    principal = principal_of(request)
    query = parse_query(request, UsageQuery)
    if query.conversation_id is not None:
        spent = await gateway.conversation_usage(principal, query.conversation_id)
        return json_response(
            ConversationUsageView(
                conversation_id=query.conversation_id,
                cost=spent.cost,
                prompt_tokens=spent.prompt_tokens,
                completion_tokens=spent.completion_tokens,
                requests=spent.requests,
            )
        )
    target = query.user_id or principal.user_id
    if target != principal.user_id:
        await request.app[keys.ORGANIZATIONS].check_member(principal, target, Action.USAGE_READ)
    this_month = await gateway.month_usage(target)
    spent = this_month.spent
    return json_response(
        UsageView(
            month=this_month.month,
            cost=spent.cost,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            requests=spent.requests,
            monthly_budget=this_month.budget,
        )
    )


@routes.route(
    "GET",
    "/api/organizations/{org_id}/llm-usage",
    summary="What the gateway metered for an organization this month, in all and by member, "
    "with their budgets (owners, admins, auditors)",
    response=OrgLlmUsage,
    errors=(403, 404),
)
async def org_usage(request: web.Request) -> web.Response:
    org_id = request.match_info["org_id"]
    members, org_budget, member_budget = await request.app[keys.ORGANIZATIONS].budgets_for_usage(
        principal_of(request), org_id
    )
    usage = await request.app[keys.GATEWAY].org_usage(org_id, members, org_budget, member_budget)
    return json_response(usage)


async def end_streams(app: web.Application) -> None:
    """on_shutdown (of the API and of the webhook listener): open streams end now with an
    error event instead of being cut (or waited for) when the server closes their
    connections."""
    gateway = app.get(keys.GATEWAY)
    if gateway is not None:
        gateway.end_streams()
