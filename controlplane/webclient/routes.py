"""/api/v1/web-client/config, /api/options/*, /api/v1/config/*: built from this deployment.

The configuration says "open source, no SaaS sign-in" and carries no user data, so it is
public: the frontend reads it before anyone signs in. The option lists hold the caller's own
model, so they need a caller like every other route (docs/api.md#the-web-frontend)."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web

from controlplane import keys
from controlplane.api.pagination import OFFSET, decode_cursor, encode_cursor
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.webclient.models import (
    LegacyWebClientConfig,
    LLMModel,
    LLMModelPage,
    ModelSearchQuery,
    WebClientConfig,
)

routes = RouteTable(tag="web-client")
STARTED = datetime.now(UTC)
AGENTS = ["CodeActAgent"]
"""The one agent our agent server runs (the SDK's default agent, OpenHands' CodeActAgent)."""
SECURITY_ANALYZERS = ["none"]
"""Our agent keeps a security analyzer setting but applies none; confirmation mode is real."""


def _split(model: str) -> tuple[str | None, str]:
    provider, _, name = model.partition("/")
    return (provider, name) if name else (None, model)


async def models_of(request: web.Request) -> list[LLMModel]:
    """The operator's models (ACS_LLM_MODELS, verified), the priced ones (ACS_LLM_PRICES) and
    the caller's own model, each once, verified first, then by name."""
    config = request.app[keys.CONFIG]
    verified = set(config.llm_models)
    names = set(verified) | set(config.llm_prices)
    own = (await request.app[keys.SETTINGS].get(principal_of(request).user_id)).llm_model
    if own:
        names.add(own)
    ordered = sorted(names, key=lambda m: (m not in verified, m))
    return [
        LLMModel(provider=_split(m)[0], name=_split(m)[1], verified=m in verified) for m in ordered
    ]


def full_name(model: LLMModel) -> str:
    return f"{model.provider}/{model.name}" if model.provider else model.name


@routes.route(
    "GET",
    "/api/v1/web-client/config",
    summary="The web frontend's configuration (open-source mode; no user data)",
    response=WebClientConfig,
    public=True,
)
async def web_client_config(request: web.Request) -> web.Response:
    return json_response(WebClientConfig(updated_at=STARTED))


@routes.route(
    "GET",
    "/api/options/config",
    summary="The web frontend's configuration, as older builds read it",
    response=LegacyWebClientConfig,
    public=True,
)
async def options_config(request: web.Request) -> web.Response:
    return json_response(LegacyWebClientConfig())


@routes.route("GET", "/api/options/models", summary="LLM models to choose from", response=list[str])
async def options_models(request: web.Request) -> web.Response:
    return json_response([full_name(m) for m in await models_of(request)])


@routes.route("GET", "/api/options/agents", summary="Agents to choose from", response=list[str])
async def options_agents(request: web.Request) -> web.Response:
    return json_response(AGENTS)


@routes.route(
    "GET",
    "/api/options/security-analyzers",
    summary="Security analyzers to choose from",
    response=list[str],
)
async def options_security_analyzers(request: web.Request) -> web.Response:
    return json_response(SECURITY_ANALYZERS)


@routes.route(
    "GET",
    "/api/v1/config/models/search",
    summary="Search the LLM models (name contains, verified, provider)",
    query=ModelSearchQuery,
    response=LLMModelPage,
)
async def search_models(request: web.Request) -> web.Response:
    query = parse_query(request, ModelSearchQuery)
    found = [
        m
        for m in await models_of(request)
        if (query.query is None or query.query.lower() in m.name.lower())
        and (query.verified__eq is None or m.verified == query.verified__eq)
        and (query.provider__eq is None or m.provider == query.provider__eq)
    ]
    raw = decode_cursor(query.page_id, OFFSET)
    start = int(raw) if raw else 0
    more = start + query.limit < len(found)
    return json_response(
        LLMModelPage(
            items=found[start : start + query.limit],
            next_page_id=encode_cursor(str(start + query.limit)) if more else None,
        )
    )


@routes.route(
    "GET",
    "/api/v1/config/providers",
    summary="The providers of the verified models (ACS_LLM_MODELS)",
    response=list[str],
)
async def providers(request: web.Request) -> web.Response:
    models = await models_of(request)
    return json_response(sorted({m.provider for m in models if m.verified and m.provider}))
