"""The sandbox proxy against real sandboxes: a sandbox's agent server and a second exposed port
(a small aiohttp server started inside the sandbox, as the agent's user) reached through
`/sandboxes/{id}/proxy/{port}/…` of a live control plane whose links point there
(ACS_PROXY_URL). Who may, what reaches the sandbox and what comes back, streaming, limits, and an
agent conversation followed on the agent's own WebSocket through the proxy."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import docker
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from tests.conftest import BOOTSTRAP_KEY
from tests.support.conversation_helpers import (
    UserFactory,
    run_on_agent_socket,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish
from tests.support.live_server import Api, LiveServer, free_port, running_sandbox
from tests.support.proxy_app import PROXIED_SPEC, serve_app
from tests.support.sandbox_helpers import OwnDocker, spec_dir

MIB = 1024 * 1024
PROXY_MAX_BODY = 2 * MIB  # above the API's own 1 MiB (ACS_MAX_BODY_BYTES): the proxy's applies
READ_TIMEOUT = 2.0
UI = "http://ui.example"

pytestmark = [
    pytest.mark.ha,
    pytest.mark.slow,
    pytest.mark.usefixtures("sandbox_images"),
    pytest.mark.live_config(
        "its_own_proxy",
        proxy_max_body_bytes=PROXY_MAX_BODY,
        proxy_read_timeout=READ_TIMEOUT,
        cors_origins=[UI],
    ),
]


@pytest.fixture
def its_own_proxy(tmp_path: Path) -> dict[str, Any]:
    """The live server's settings: its links point at its own proxy (it is its own balancer
    here), on a port chosen first; the `proxied` spec stands beside the default."""
    port = free_port()
    return {
        "port": port,
        "proxy_url": f"http://127.0.0.1:{port}",
        "spec_dir": spec_dir(tmp_path, {"proxied": PROXIED_SPEC}),
    }


async def _serve_app(
    docker_client: docker.DockerClient, prefix: str, api: Api, sandbox: dict[str, Any]
) -> str:
    """Start APP in the sandbox as the agent's user; returns WORKER_1's link once it answers."""
    await serve_app(docker_client, prefix, sandbox["id"])
    link = next(u["url"] for u in sandbox["exposed_urls"] if u["name"] == "WORKER_1")
    deadline = time.monotonic() + 30
    while True:
        status, _ = await api.call("GET", link.removeprefix(api.base) + "headers")
        if status == 200:
            return str(link)
        assert time.monotonic() < deadline, f"the sandbox's app did not answer: {status}"
        await asyncio.sleep(0.2)


def _path(link: str, base: str) -> str:
    return link.removeprefix(base)


async def test_the_proxy_serves_its_owner_and_nobody_else(
    live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    own_docker: OwnDocker,
) -> None:
    alice_key = (await ApiKeyService(raw_redis, None).create("alice")).key
    bob_key = (await ApiKeyService(raw_redis, None).create("bob")).key
    alice, bob = Api(http, live.url, alice_key), Api(http, live.url, bob_key)
    admin = Api(http, live.url, BOOTSTRAP_KEY)
    sandbox = await running_sandbox(alice, "proxied")
    sid, session_key = sandbox["id"], sandbox["session_api_key"]
    agent = next(u["url"] for u in sandbox["exposed_urls"] if u["name"] == "AGENT_SERVER")
    assert agent == f"{live.url}/sandboxes/{sid}/proxy/agent"  # the link is the proxy's
    worker = await _serve_app(own_docker.client, own_docker.prefix, alice, sandbox)
    assert worker == f"{live.url}/sandboxes/{sid}/proxy/WORKER_1/"
    health = _path(agent, live.url) + "/health"

    async def status(path: str, **headers: str) -> int:
        async with http.get(live.url + path, headers=headers) as resp:
            return resp.status

    # Who may: the owner's key (header or Bearer), the sandbox's key (header, Bearer, query).
    assert await status(health, **{"X-Session-API-Key": alice_key}) == 200
    assert await status(health, Authorization=f"Bearer {alice_key}") == 200
    assert await status(health, **{"X-Session-API-Key": session_key}) == 200
    assert await status(health, Authorization=f"Bearer {session_key}") == 200
    assert await status(f"{health}?session_api_key={session_key}") == 200
    # The agent's API authenticates the sandbox's key, which the proxy put there for the user.
    assert (await alice.call("GET", _path(agent, live.url) + "/api/conversations/search"))[0] == 200
    # Nobody else: no key, a wrong one, another user's, an admin's, another sandbox's key.
    assert await status(health) == 401
    assert await status(health, **{"X-Session-API-Key": "acs_wrong-key-wrong-key"}) == 401
    assert (await bob.call("GET", _path(health, live.url)))[0] == 404
    assert (await admin.call("GET", _path(health, live.url)))[0] == 404
    bobs = await running_sandbox(bob)
    assert await status(health, **{"X-Session-API-Key": bobs["session_api_key"]}) == 401
    # Only the ports the spec exposes, by name, any case, or by number.
    for port in ("worker_1", "9000"):
        assert (await alice.call("GET", f"/sandboxes/{sid}/proxy/{port}/headers"))[0] == 200
    assert (await alice.call("GET", f"/sandboxes/{sid}/proxy/22/"))[0] == 404
    assert (await alice.call("GET", f"/sandboxes/{sid}/proxy/nope/"))[0] == 404
    # Digits that int() refuses (found by the OpenAPI fuzzer as a 500): a 404 like any other.
    for odd in ("%C2%B3", "%D9%A3", "9" * 5000):
        assert (await alice.call("GET", f"/sandboxes/{sid}/proxy/{odd}/"))[0] == 404

    # What reaches the sandbox: none of the user's credentials, no Origin; forwarding headers.
    sent = {
        "X-Session-API-Key": alice_key,
        "Cookie": "acs_session=the-users-session; theirs=kept",
        "Origin": UI,
    }
    async with http.get(worker + "headers", headers=sent) as resp:
        assert resp.status == 200
        seen = await resp.json()
    got = {k.lower(): v for k, v in seen["headers"].items()}
    assert alice_key not in json.dumps(seen)
    assert "x-session-api-key" not in got
    assert "origin" not in got
    assert "cookie" not in got  # this origin's cookies are the control plane's, none passes
    assert got["x-forwarded-prefix"] == f"/sandboxes/{sid}/proxy/WORKER_1"
    _, seen = await Api(http, live.url, session_key).call(
        "GET", _path(worker, live.url) + "headers?session_api_key=" + session_key + "&x=1"
    )
    assert seen["path"] == "/headers?x=1"  # the credential is not passed on, the rest is

    # What comes back: no cookie (tests/security/test_sandbox_answers.py has the rest); the
    # sandbox's CORS answer replaced by the control plane's; an opaque origin for pages.
    async with http.get(
        worker + "cookies", headers={"X-Session-API-Key": alice_key, "Origin": UI}
    ) as resp:
        assert resp.status == 200
        assert resp.headers.getall("Set-Cookie", []) == []
        assert resp.headers["Access-Control-Allow-Origin"] == UI
        assert resp.headers["Content-Security-Policy"].startswith("sandbox ")

    # Paused: a clear 409; deleted: gone for everyone, its key with it.
    assert (await alice.call("POST", f"/api/v1/sandboxes/{sid}/pause"))[0] == 200
    status_code, body = await alice.call("GET", _path(health, live.url))
    assert status_code == 409
    assert "PAUSED" in body["detail"]
    assert (await alice.call("DELETE", f"/api/v1/sandboxes/{sid}"))[0] == 200
    assert (await alice.call("GET", _path(health, live.url)))[0] == 404
    assert await status(health, **{"X-Session-API-Key": session_key}) == 401


async def test_the_proxy_streams_both_ways_within_its_limits(
    live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    own_docker: OwnDocker,
) -> None:
    key = (await ApiKeyService(raw_redis, None).create("alice")).key
    alice = Api(http, live.url, key)
    sandbox = await running_sandbox(alice, "proxied")
    worker = await _serve_app(own_docker.client, own_docker.prefix, alice, sandbox)
    auth = {"X-Session-API-Key": key}

    # A large download, streamed: every byte, in order.
    size, digest = 128 * MIB, hashlib.sha256()
    block = bytes(range(256)) * 4096
    expected = hashlib.sha256(block * (size // len(block))).hexdigest()
    started = time.monotonic()
    async with http.get(worker + f"big?mb={size >> 20}", headers=auth) as resp:
        assert resp.status == 200
        assert resp.content_length == size
        async for chunk in resp.content.iter_chunked(1 << 20):
            digest.update(chunk)
    took = time.monotonic() - started
    assert digest.hexdigest() == expected
    print(f"{size >> 20} MiB through the proxy in {took:.2f} s ({size / MIB / took:.0f} MiB/s)")

    # Uploads: above the API's 1 MiB and under the proxy's limit passes; over it, a 413 before
    # a byte is sent (declared length) or the connection cut (a chunked body running over).
    body = b"u" * (PROXY_MAX_BODY - 1024)
    upload = _path(worker, live.url) + "upload"
    status, seen = await alice.call("POST", upload, data=io.BytesIO(body))
    assert (status, seen) == (200, {"bytes": len(body)})
    status, seen = await alice.call("POST", upload, data=io.BytesIO(body + body))
    assert status == 413, seen

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield body[: PROXY_MAX_BODY // 2]

    try:
        async with http.post(worker + "upload", data=chunked(), headers=auth) as resp:
            status = resp.status
    except aiohttp.ClientError:
        status = 0  # cut off mid-body: also a refusal
    assert status in (0, 413), status

    # Time: an answer that does not begin within ACS_PROXY_READ_TIMEOUT is a 504.
    started = time.monotonic()
    status, seen = await alice.call("GET", _path(worker, live.url) + "slow?s=5")
    assert status == 504, seen
    assert time.monotonic() - started < READ_TIMEOUT + 2
    assert (await alice.call("GET", _path(worker, live.url) + "slow?s=0.1"))[0] == 200

    # A WebSocket, text and binary both ways, a message larger than a socket buffer included.
    async with http.ws_connect(worker.replace("http", "ws", 1) + "ws", headers=auth) as ws:
        await ws.send_str("hello")
        assert (await ws.receive_str()) == "HELLO"
        payload = bytes(range(256)) * 2048
        await ws.send_bytes(payload)
        assert (await ws.receive_bytes()) == payload[::-1]
    # Nobody else's WebSocket either.
    async with http.get(
        worker + "ws",
        headers={
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    ) as resp:
        assert resp.status == 401


async def test_an_agent_conversation_followed_through_the_proxy(
    user: UserFactory, fake_llm: FakeLLM, live: LiveServer, http: aiohttp.ClientSession
) -> None:
    """As OpenHands' web frontend does: conversation_url gives the agent server's base, its
    WebSocket carries the sandbox's key in the query, messages go with X-Session-API-Key."""
    fake_llm.script([reply_finish("first"), reply_finish("second")])
    alice = await user("alice")
    task = await alice.ok("POST", "/api/v1/app-conversations", json={})
    deadline = time.monotonic() + 90
    while task["status"] not in ("READY", "ERROR"):
        assert time.monotonic() < deadline, task
        await asyncio.sleep(0.1)
        (task,) = await alice.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}")
    assert task["status"] == "READY", task
    cid = task["app_conversation_id"]
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    base = conversation["conversation_url"].split("/api/conversations")[0]
    assert base == f"{live.url}/sandboxes/{conversation['sandbox_id']}/proxy/agent"
    assert task["agent_server_url"] == base
    key = conversation["session_api_key"]
    frames = await run_on_agent_socket(http, base, cid, key, "hello through the proxy")
    said = [f for f in frames if f["kind"] == "MessageEvent" and f.get("source") == "user"]
    assert said, [f["kind"] for f in frames]
    # The same events reached the control plane (the agent's webhooks), as without the proxy.
    await wait_finished(alice, cid)
