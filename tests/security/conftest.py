"""What the attacks of tests/security/ share: a hostile provider, a canary where nothing may
connect, a control plane serving the LLM gateway over real HTTP, and its users; the live
control planes of the sandbox attacks (the default configuration, no host port open to
sandboxes, spec files of the module's)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig
from controlplane.gateway.translator_process import TranslatorProcess
from tests.support.hostile_llm import Canary, HostileUpstream
from tests.support.live_server import LiveServer, LiveServerFactory, start_live_server
from tests.support.sandbox_helpers import spec_dir

GATEWAY = "/api/v1/llm-gateway/v1"
PROVIDER_KEY = "sk-mallory-own-SECRET-71aa"


class Member:
    """One user of a live server: their API key, their settings, their gateway key."""

    def __init__(self, http: aiohttp.ClientSession, base: str, api_key: str) -> None:
        self.http, self.base = http, base
        self.headers = {"X-Session-API-Key": api_key}

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        headers = kwargs.pop("headers", self.headers)
        async with self.http.request(method, self.base + path, headers=headers, **kwargs) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def settings(self, **body: Any) -> None:
        status, answer = await self.call("POST", "/api/settings", json=body)
        assert status == 200, answer

    async def gateway_key(self) -> str:
        status, answer = await self.call("GET", "/api/keys/llm/byor")
        assert status == 200, answer
        return str(answer["key"])

    async def ask(
        self, key: str, *, stream: bool = False, model: str = "m", **extra: Any
    ) -> tuple[int, str, bytes]:
        """One model call through the gateway: status, content type, the raw answer."""
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        if stream:
            body["stream"] = True
        async with self.http.post(
            self.base + GATEWAY + "/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            return resp.status, resp.content_type, await resp.read()

    async def usage(self) -> dict[str, Any]:
        status, answer = await self.call("GET", "/api/v1/llm-gateway/usage")
        assert status == 200, answer
        return dict(answer)


MemberFactory = Callable[..., Awaitable[Member]]


@pytest.fixture
async def hostile() -> AsyncIterator[HostileUpstream]:
    upstream = await HostileUpstream().start()
    yield upstream
    await upstream.close()


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    """On this host, on a port no user may call (not in ACS_SANDBOX_HOST_PORTS)."""
    server = await Canary().start()
    yield server
    await server.close()


@pytest.fixture
async def gateway_server(
    make_config: Callable[..., ServiceConfig], hostile: HostileUpstream
) -> AsyncIterator[Callable[..., Awaitable[LiveServer]]]:
    """A control plane without sandboxes whose users may call the hostile provider (its port
    is a host port, as a model server on this host's would be); closed after the test.
    `translator`: the worker's (tests/support/shared_translator.py) instead of its own."""
    servers: list[LiveServer] = []

    async def make(translator: TranslatorProcess | None = None, **overrides: Any) -> LiveServer:
        values: dict[str, Any] = {
            "sandbox_host_ports": [hostile.port],
            "llm_gateway_backoff": 0.05,
            "llm_gateway_retries": 0,
            "llm_gateway_timeout": 20,
            "llm_prices": {"m": (0.001, 0.002)},
        }
        values.update(overrides)
        server = await start_live_server(
            make_config(**values), with_sandboxes=False, translator=translator
        )
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.close()


@pytest.fixture
async def member(raw_redis: aioredis.Redis) -> AsyncIterator[MemberFactory]:
    """`make(server, name, redis=None)`: a user of `server`, whose API key is made in `redis`
    (the server's, when not the tests' own)."""
    async with aiohttp.ClientSession() as http:

        async def make(
            server: LiveServer, name: str = "mallory", redis: aioredis.Redis | None = None
        ) -> Member:
            created = await ApiKeyService(redis or raw_redis, None).create(name)
            return Member(http, server.url, created.key)

        yield make


@pytest.fixture
async def make_plain_live(
    test_prefix: str,
    make_config: Callable[..., ServiceConfig],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LiveServerFactory]:
    """`await make_plain_live(specs=None, **settings)`: the control plane over HTTP, its
    sandboxes under this test's prefix; `specs` (name -> YAML) stand beside the default spec,
    `settings` go to the configuration. Closed after the test."""
    servers: list[LiveServer] = []

    async def make(*, specs: dict[str, str] | None = None, **settings: Any) -> LiveServer:
        if specs is not None:
            settings["spec_dir"] = spec_dir(tmp_path_factory.mktemp("specs"), specs)
        server = await start_live_server(make_config(container_prefix=test_prefix, **settings))
        servers.append(server)
        return server

    yield make
    for server in reversed(servers):
        await server.close()
