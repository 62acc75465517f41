"""Finding 7 of issue 26: an answer from a sandbox must not act on the control plane's origin.

A real sandbox whose agent server is hostile (any process on the agent port: the agent's
commands run as the same user as the agent server) answers every request with an HTML page and
the headers that would act on the origin serving it: cookies (the control plane's session cookie
among them), Clear-Site-Data, HSTS, Alt-Svc, reporting endpoints, its own CSP and
Referrer-Policy, a credentials prompt, CORS, a public Cache-Control. Its answers reach the
owner's browser three ways, all on the control plane's origin: the sandbox proxy, Agent Canvas's
cloud proxy, and a conversation's file read. None of those headers comes back, and every answer
carries the sandbox CSP (an opaque origin) and nosniff."""

from __future__ import annotations

import asyncio
import secrets
import textwrap
import time
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from multidict import CIMultiDictProxy

from controlplane.auth.service import ApiKeyService
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from tests.support.live_server import Api, LiveServer, LiveServerFactory
from tests.support.sandbox_helpers import DEFAULT_IMAGE

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sandbox_images")]

HOSTILE_HEADERS = [
    ("Set-Cookie", "acs_session=planted; Path=/"),
    ("Set-Cookie", "tracker=1; Path=/; Domain=127.0.0.1; Max-Age=99999999"),
    ("Clear-Site-Data", '"cookies", "storage", "cache"'),
    ("Strict-Transport-Security", "max-age=63072000; includeSubDomains; preload"),
    ("Alt-Svc", 'h2="evil.example:443"; ma=2592000'),
    ("NEL", '{"report_to": "x", "max_age": 31536000, "include_subdomains": true}'),
    ("Report-To", '{"group": "x", "max_age": 31536000, "endpoints": [{"url": "https://e.x/r"}]}'),
    ("Reporting-Endpoints", 'x="https://evil.example/r"'),
    ("Content-Security-Policy", "default-src *; report-uri https://evil.example/csp"),
    ("Referrer-Policy", "unsafe-url"),
    ("Service-Worker-Allowed", "/"),
    ("WWW-Authenticate", 'Basic realm="Agent Conversation Service"'),
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Credentials", "true"),
    ("Accept-CH", "Sec-CH-UA-Full-Version-List"),
    ("Origin-Agent-Cluster", "?0"),
    ("Set-Login", "logged-out"),
    ("Cache-Control", "public, max-age=31536000, s-maxage=31536000"),
]
PAGE = "<script>fetch('/api/v1/users/me').then(r => r.text()).then(t => alert(t))</script>"
HOSTILE_AGENT = f"""
from aiohttp import web

HEADERS = {HOSTILE_HEADERS!r}

async def health(request):
    return web.json_response({{"status": "ok"}})

async def page(request):
    response = web.Response(text={PAGE!r}, content_type="text/html")
    for name, value in HEADERS:
        response.headers.add(name, value)
    return response

app = web.Application()
app.router.add_get("/health", health)
app.router.add_route("*", "/{{tail:.*}}", page)
web.run_app(app, host="0.0.0.0", port=8000, print=None)
"""
HOSTILE_SPEC = f"""
id: hostile
description: an agent server replaced by a hostile one
image: {DEFAULT_IMAGE}
command:
  - /opt/agent/bin/python
  - -c
  - |
{textwrap.indent(HOSTILE_AGENT.strip(), "    ")}
working_dir: /workspace
exposed_ports: {{AGENT_SERVER: 8000}}
resources: {{cpus: 1.0, memory: 512m, pids: 256}}
"""


@pytest.fixture
async def hostile_live(make_plain_live: LiveServerFactory) -> LiveServer:
    """The control plane over HTTP with the `hostile` spec beside the default."""
    return await make_plain_live(specs={"hostile": HOSTILE_SPEC}, reconcile_interval=1.0)


REPLACED = {"content-security-policy", "cache-control", "referrer-policy"}
ACTING = {name.lower() for name, _ in HOSTILE_HEADERS} - REPLACED


def _acts_on_our_origin(headers: CIMultiDictProxy[str]) -> list[str]:
    """What of the hostile answer would act on the control plane's origin, if it came back."""
    found = [name for name in headers if name.lower() in ACTING]
    if headers.get("Content-Security-Policy", "").startswith("default-src"):
        found.append("the sandbox's Content-Security-Policy")
    if "public" in headers.get("Cache-Control", ""):
        found.append("Cache-Control: public")
    if headers.get("Referrer-Policy") == "unsafe-url":
        found.append("Referrer-Policy: unsafe-url")
    return found


def _confined(headers: CIMultiDictProxy[str]) -> None:
    assert _acts_on_our_origin(headers) == [], dict(headers)
    assert headers.getall("Content-Security-Policy") == [headers["Content-Security-Policy"]]
    assert headers["Content-Security-Policy"].startswith("sandbox ")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "private" in headers.get("Cache-Control", "private")


async def _running(api: Api) -> dict[str, Any]:
    created = await api.ok("POST", "/api/v1/sandboxes", json={"sandbox_spec_id": "hostile"})
    deadline = time.monotonic() + 120
    while True:
        sandbox = await api.ok("GET", f"/api/v1/sandboxes/{created['id']}")
        if sandbox["status"] == "RUNNING":
            return dict(sandbox)
        assert sandbox["status"] == "STARTING", sandbox
        assert time.monotonic() < deadline, sandbox
        await asyncio.sleep(0.2)


async def test_a_hostile_sandbox_answer_cannot_act_on_our_origin(
    hostile_live: LiveServer, http: aiohttp.ClientSession, raw_redis: aioredis.Redis
) -> None:
    key = (await ApiKeyService(raw_redis, None).create("alice")).key
    alice = Api(http, hostile_live.url, key)
    sandbox = await _running(alice)
    sid, session_key = sandbox["id"], sandbox["session_api_key"]
    agent = next(u["url"] for u in sandbox["exposed_urls"] if u["name"] == "AGENT_SERVER")

    # The sandbox really sends all of it (straight to its published port).
    async with http.get(agent + "/page") as resp:
        assert len(_acts_on_our_origin(resp.headers)) >= len(HOSTILE_HEADERS) - 1

    # The sandbox proxy (the owner's browser session would see this page on our origin).
    async with http.get(
        f"{hostile_live.url}/sandboxes/{sid}/proxy/agent/page", headers=alice.headers
    ) as r:
        assert r.status == 200
        assert await r.text() == PAGE
        _confined(r.headers)

    # Agent Canvas's cloud proxy, with the sandbox's key.
    envelope = {
        "host": agent.rsplit("/", 1)[0] if agent.count("/") > 2 else agent,
        "method": "GET",
        "path": "/api/anything",
        "headers": {"X-Session-API-Key": session_key},
    }
    async with http.post(f"{hostile_live.url}/api/cloud-proxy", json=envelope) as r:
        assert r.status == 200, await r.text()
        _confined(r.headers)

    # A conversation's file read, as a link the owner's browser could be sent to.
    conversation_id = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=conversation_id, created_by_user_id="alice", sandbox_id=sid)
    )
    async with http.get(
        f"{hostile_live.url}/api/v1/app-conversations/{conversation_id}/file",
        params={"file_path": "/workspace/page.html"},
        headers=alice.headers,
    ) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/html")  # as the sandbox said...
        _confined(r.headers)  # ...but in an opaque origin, unsniffed
