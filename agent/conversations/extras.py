"""The conversation routes beyond running one: secrets, confirmation policy, security analyzer,
title and tags, ask_agent, generate_title, agent_final_response, condense; and the two the
server refuses on purpose, load_plugin and navigate (docs/agent-protocol.md)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from ..errors import ApiError
from ..validation import parse_json_body
from . import events as ev
from .conversation import Conversation
from .llm import LLMError
from .loop import system_message
from .models import (
    AskAgentRequest,
    GenerateTitleRequest,
    SetConfirmationPolicyRequest,
    SetSecurityAnalyzerRequest,
    UpdateConversationRequest,
    UpdateSecretsRequest,
)
from .mount import Handler
from .queries import message_text
from .secrets import static_values
from .service import title_from

SUCCESS = {"success": True}
Lookup = Callable[[web.Request], Conversation]


def update_secrets(conv: Conversation, body: UpdateSecretsRequest) -> None:
    """Secrets are added or replaced; commands see them from their next run on."""
    conv.request.secrets.update(body.secrets)
    conv.masker.add(v for s in body.secrets.values() for v in s.known_values())
    env = dict(conv.toolbox.context.env)
    env.update(static_values(body.secrets))
    conv.toolbox.context.env = env
    conv.save()


def set_confirmation_policy(conv: Conversation, body: SetConfirmationPolicyRequest) -> None:
    conv.request.confirmation_policy = body.policy
    conv.emit(ev.state_update_event("confirmation_policy", body.policy.dump()))
    conv.changed()


def final_response(conv: Conversation) -> str:
    """The message of the last ``finish`` action, or the text of the last agent message."""
    for event in reversed(conv.events):
        action = event.get("action") or {}
        if event["kind"] == "ActionEvent" and action.get("kind") == "FinishAction":
            return str(action.get("message", ""))
        if event["kind"] == "MessageEvent" and event.get("source") == "agent":
            return message_text(event)
    return ""


async def ask_agent(conv: Conversation, question: str) -> str:
    """One LLM call on the conversation so far plus the question; nothing is recorded."""
    messages = [system_message(conv), *conv.history, {"role": "user", "content": question}]
    try:
        response = await conv.llm.complete(messages, [])
    except LLMError as exc:
        raise ApiError(502, str(exc)) from exc
    answer: str = conv.masker.text(response.content)
    return answer


def refusals(lookup: Lookup) -> dict[str, Handler]:
    """Calls of openhands-sdk 1.58 refused on purpose (as agent/refusals.py's): 400 with why,
    after the 404 of an unknown conversation."""

    async def load_plugin(request: web.Request) -> web.Response:
        lookup(request)
        raise ApiError(400, "this agent server loads no plugins")

    async def navigate(request: web.Request) -> web.Response:
        lookup(request)
        raise ApiError(400, "this agent server keeps one linear history: navigate is not supported")

    return {"POST /load_plugin": load_plugin, "POST /navigate": navigate}


def make_routes(lookup: Lookup) -> dict[str, Handler]:
    """The handlers by "METHOD suffix" (the suffix follows ``/api/conversations/{id}``)."""

    async def secrets(request: web.Request) -> web.Response:
        conv = lookup(request)
        update_secrets(conv, await parse_json_body(request, UpdateSecretsRequest))
        return web.json_response(SUCCESS)

    async def confirmation_policy(request: web.Request) -> web.Response:
        conv = lookup(request)
        set_confirmation_policy(conv, await parse_json_body(request, SetConfirmationPolicyRequest))
        return web.json_response(SUCCESS)

    async def security_analyzer(request: web.Request) -> web.Response:
        conv = lookup(request)
        body = await parse_json_body(request, SetSecurityAnalyzerRequest)
        conv.state.security_analyzer = body.security_analyzer  # kept and shown, not applied
        conv.changed()
        return web.json_response(SUCCESS)

    async def update(request: web.Request) -> web.Response:
        conv = lookup(request)
        body = await parse_json_body(request, UpdateConversationRequest)
        if body.title is not None:
            conv.state.title = body.title.strip()
        if body.tags is not None:
            conv.request.tags = dict(body.tags)
        conv.changed()
        return web.json_response(SUCCESS)

    async def ask(request: web.Request) -> web.Response:
        conv = lookup(request)
        body = await parse_json_body(request, AskAgentRequest)
        return web.json_response({"response": await ask_agent(conv, body.question)})

    async def generate_title(request: web.Request) -> web.Response:
        conv = lookup(request)
        raw = await request.read()
        body = (
            await parse_json_body(request, GenerateTitleRequest) if raw else GenerateTitleRequest()
        )
        first = next(
            (e for e in conv.events if e["kind"] == "MessageEvent" and e["source"] == "user"), None
        )
        title = title_from(message_text(first), body.max_length) if first else None
        return web.json_response({"title": title or f"Conversation {conv.id[:5]}"})

    async def agent_final_response(request: web.Request) -> web.Response:
        return web.json_response({"response": final_response(lookup(request))})

    async def condense(request: web.Request) -> web.Response:
        lookup(request)
        raise ApiError(409, "This agent has no condenser that handles condensation requests")

    return {
        "POST /secrets": secrets,
        "POST /confirmation_policy": confirmation_policy,
        "POST /security_analyzer": security_analyzer,
        "PATCH ": update,
        "POST /ask_agent": ask,
        "POST /generate_title": generate_title,
        "GET /agent_final_response": agent_final_response,
        "POST /condense": condense,
        **refusals(lookup),
    }
