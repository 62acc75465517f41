"""Fixtures and helpers for end-to-end conversation tests: a live control plane, a fake LLM on
its sandbox network's gateway (a host service sandboxes may reach: ACS_SANDBOX_HOST_PORTS),
users with settings, and bounded polling of tasks and events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig
from tests.support.fake_llm import FakeLLM
from tests.support.live_server import Api, LiveServer, free_port, start_live_server

LLM_KEY = "sk-live-SECRET-7f3a9c"
PRICES = {"fake-model": (0.001, 0.002)}


@pytest.fixture
def fake_llm_port() -> int:
    """The fake LLM's port, chosen before the control plane starts: its firewall opens it."""
    return free_port()


@pytest.fixture
async def fake_llm(live: LiveServer, fake_llm_port: int) -> AsyncIterator[FakeLLM]:
    """The scripted model on `live`'s sandbox network gateway, where sandboxes reach this host
    (as host.docker.internal)."""
    gateway = await live.sandbox_gateway()
    fake = FakeLLM(host=gateway, port=fake_llm_port, model="fake-model", api_key=LLM_KEY)
    await fake.start()
    yield fake
    await fake.close()


LIVE_CONFIG = "live_config"


@pytest.fixture
async def live(
    request: pytest.FixtureRequest,
    test_prefix: str,
    make_config: Callable[..., ServiceConfig],
    fake_llm_port: int,
) -> AsyncIterator[LiveServer]:
    """The control plane over HTTP on loopback, its sandboxes on Docker under this test's prefix:
    prices set, the fake LLM's port open to sandboxes, a reconciler every second. One server for
    every test that talks to a live control plane, so that `user` and `fake_llm` serve them all.

    A module changes it in its pytestmark (a test, in its own marker, which wins) with
    `pytest.mark.live_config(*fixtures, **settings)`: `settings` go to the configuration, and
    each fixture named in `fixtures` returns more of them (values that come from other fixtures:
    ports chosen first, a spec dir, the browser's link). Two keys are not configuration but
    where the server listens: `host` and `port`."""
    settings: dict[str, Any] = {
        "container_prefix": test_prefix,
        "reconcile_interval": 1.0,
        "llm_prices": PRICES,
        "sandbox_host_ports": [fake_llm_port],
    }
    # The module's marker first, then the test's: the closer one wins.
    for marker in reversed(list(request.node.iter_markers(LIVE_CONFIG))):
        for name in marker.args:
            settings.update(request.getfixturevalue(name))
        settings.update(marker.kwargs)
    host, port = settings.pop("host", "127.0.0.1"), settings.pop("port", 0)
    server = await start_live_server(make_config(**settings), host=host, port=port)
    yield server
    await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


UserFactory = Callable[..., Awaitable[Api]]


async def new_user(
    http: aiohttp.ClientSession,
    url: str,
    raw_redis: aioredis.Redis,
    fake: FakeLLM,
    name: str = "alice",
    **settings: Any,
) -> Api:
    """A user of the control plane at `url` with an API key and LLM settings pointing at `fake`
    (as sandboxes reach it); `settings` add to or change them."""
    created = await ApiKeyService(raw_redis, None).create(name)
    api = Api(http, url, created.key)
    body = {
        "llm_model": "fake-model",
        "llm_base_url": fake.container_base_url,
        "llm_api_key": LLM_KEY,
        **settings,
    }
    await api.ok("POST", "/api/settings", json=body)
    return api


@pytest.fixture
def user(
    live: LiveServer, http: aiohttp.ClientSession, raw_redis: aioredis.Redis, fake_llm: FakeLLM
) -> UserFactory:
    """A user of `live` with an API key and LLM settings pointing at the fake LLM."""

    async def make(name: str = "alice", **settings: Any) -> Api:
        return await new_user(http, live.url, raw_redis, fake_llm, name, **settings)

    return make


def message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


async def start_and_wait(api: Api, within: float = 60, **request: Any) -> dict[str, Any]:
    """POST a start request and poll its task until READY or ERROR; returns the last task."""
    task = await api.ok("POST", "/api/v1/app-conversations", json=request)
    assert task["status"] == "WORKING", task
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        (current,) = await api.ok("GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}")
        if current["status"] in ("READY", "ERROR"):
            return dict(current)
        await asyncio.sleep(0.05)
    raise AssertionError(f"start task {task['id']} not finished after {within}s: {current}")


async def events_of(api: Api, conversation_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    page_id = None
    while True:
        query = f"conversation_id__eq={conversation_id}&limit=100"
        if page_id:
            query += f"&page_id={page_id}"
        page = await api.ok("GET", f"/api/v1/events/search?{query}")
        out += page["items"]
        page_id = page["next_page_id"]
        if not page_id:
            return out


async def wait_events(
    api: Api,
    conversation_id: str,
    until: Callable[[list[dict[str, Any]]], bool],
    within: float = 60,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    events: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        events = await events_of(api, conversation_id)
        if until(events):
            return events
        await asyncio.sleep(0.1)
    kinds = [(e["kind"], e.get("code") or e.get("value") or e.get("tool_name")) for e in events]
    raise AssertionError(f"events of {conversation_id} never matched; got {kinds}")


async def wait_finished(api: Api, conversation_id: str, within: float = 60) -> list[dict[str, Any]]:
    """The conversation's events once its last execution status is `finished`."""
    return await wait_events(api, conversation_id, status_is("finished"), within)


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def status_is(value: str) -> Callable[[list[dict[str, Any]]], bool]:
    def check(events: list[dict[str, Any]]) -> bool:
        updates = [
            e["value"]
            for e in events
            if e["kind"] == "ConversationStateUpdateEvent" and e.get("key") == "execution_status"
        ]
        return bool(updates) and updates[-1] == value

    return check


async def wait_conversation(
    api: Api, conversation_id: str, field: str, value: Any, within: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = await api.ok("GET", f"/api/v1/app-conversations/{conversation_id}")
        if body.get(field) == value:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"conversation {field} never became {value}: {body}")


async def run_on_agent_socket(
    http: aiohttp.ClientSession,
    agent_url: str,
    conversation_id: str,
    key: str,
    text: str,
    *,
    within: float = 60,
) -> list[dict[str, Any]]:
    """Sends `text` to the conversation on its agent server (`agent_url`, reached as a client
    reaches it) and runs it, following its events socket from the start: the frames up to
    the run's `finished`."""
    socket = f"{agent_url.replace('http', 'ws', 1)}/sockets/events/{conversation_id}"
    frames: list[dict[str, Any]] = []
    params = {"resend_all": "true", "session_api_key": key}
    async with http.ws_connect(socket, params=params) as ws:
        async with http.post(
            f"{agent_url}/api/conversations/{conversation_id}/events",
            json={**message(text), "run": True},
            headers={"X-Session-API-Key": key},
        ) as resp:
            assert resp.status in (200, 201), await resp.text()
        deadline = time.monotonic() + within
        while not status_is("finished")(frames):
            left = deadline - time.monotonic()
            assert left > 0, [(f["kind"], f.get("key"), f.get("value")) for f in frames]
            try:
                frames.append(json.loads(await asyncio.wait_for(ws.receive_str(), left)))
            except TimeoutError:
                continue
    return frames
