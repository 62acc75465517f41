"""Shared fixtures: a real redis-server per session, a flushed Redis and a fresh app per test.

Docker fixtures (for sandbox tests) live in tests/support/docker_fixtures.py, loaded as a plugin.
A test that uses one of them, directly or through another fixture, is marked `docker` here (and
one that drives Chromium `browser`), so `make test-unit` runs everything that needs no more than
redis-server.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from controlplane.app import create_app
from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig, load_config
from tests.support.redis_server import RedisServer
from tests.support.run_id import RUN_ID
from tests.support.tasks import close_or_show_tasks
from tests.support.types import Client, ClientFactory

pytest_plugins = [
    # Before docker_fixtures, which imports it (a plugin imported first is not assert-rewritten).
    "tests.support.sandbox_helpers",
    "tests.support.docker_fixtures",
    "tests.support.conversation_helpers",
    "tests.support.records",
    "tests.support.openhands_clients",
    "tests.support.agent_canvas",
    "tests.support.browser_netns",
    "tests.support.oidc_provider",
    "tests.support.oidc_sign_in",
    "tests.support.snapshot_fixtures",
    "tests.support.second_engine",
    "tests.support.shared_translator",
]

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP_KEY = "test-bootstrap-key-" + secrets.token_hex(8)
MARKS_BY_FIXTURE = {"docker_client": "docker", "chromium": "browser", "browser_net": "browser"}
"""A test using one of these fixtures, directly or through another (every Docker fixture, such as
test_prefix, sandbox_images or a live server with sandboxes, depends on docker_client), gets the
marker: `make test-unit` leaves them out."""


GROUPS_BY_FIXTURE = {"kube_cluster": "kube", "worker_translator": "translator"}
"""Tests that share an expensive set-up they may not each make: under pytest-xdist
(`--dist loadgroup`, as `make test` runs) a group runs on one worker, which makes that set-up once
(the test cluster is package-scoped: up before the first of its tests, down after the last; the
LLM translator, tests/support/shared_translator.py, once per worker)."""


# First: pytest-xdist's own hook on each worker reads the xdist_group marks (making a group's
# tests one scheduling unit), and runs before a conftest's unless this one is tryfirst; without
# it every worker brought the cluster up for itself.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, mark in MARKS_BY_FIXTURE.items():
            if fixture in used:
                item.add_marker(getattr(pytest.mark, mark))
        for fixture, group in GROUPS_BY_FIXTURE.items():
            if fixture in used:
                item.add_marker(pytest.mark.xdist_group(group))
    # The longest group first: the worker that takes it starts at once, and the rest of the
    # suite fills the other workers meanwhile (a stable sort keeps each group's own order).
    # The slow tier is not moved forward too: run together, its tests (the fuzzer, chaos, the
    # real clients) loaded the host so that `openhands --version` took over 120 s.
    items.sort(key=lambda item: 0 if item.get_closest_marker("xdist_group") else 1)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of this test alone (AOF on), so it can be stopped, frozen and started
    again."""
    server = RedisServer(tmp_path_factory.mktemp("own-redis"))
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.process.send_signal(signal.SIGCONT)  # in case a test left it stopped
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
async def raw_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def make_config(redis_url: str, tmp_path: Path) -> Callable[..., ServiceConfig]:
    def make(**overrides: Any) -> ServiceConfig:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "data_dir": tmp_path / "data",
            "bootstrap_api_key": BOOTSTRAP_KEY,
            "spec_dir": REPO / "specs",
            "container_prefix": f"acs-test-{RUN_ID}-",
            "log_format": "json",
            # Polling helpers would trip the per-key limit; tests/api/test_rate_limit.py turns it
            # on.
            "rate_limit_per_minute": 0,
            # Tests count containers and sandboxes: the warm pool is on only where a test asks.
            "warm_pool": "0",
            # Every test makes a network: /24s leave room for the parallel runs on one engine.
            "sandbox_subnet_size": 24,
            "image_tag": os.environ.get("ACS_IMAGE_TAG") or None,
        }
        values.update(overrides)
        return load_config({}, **values)

    return make


@pytest.fixture
def config(make_config: Callable[..., ServiceConfig]) -> ServiceConfig:
    return make_config()


@pytest.fixture
async def make_client(
    aiohttp_client: Any, make_config: Callable[..., ServiceConfig]
) -> AsyncIterator[ClientFactory]:
    """An app without Docker services unless with_sandboxes=True. The apps close here, newest
    first, before aiohttp_client's own clean-up; one that does not close within a minute fails
    the test with the stack of every asyncio task (what its close waits for)."""
    clients: list[Client] = []

    async def make(*, with_sandboxes: bool = False, **overrides: Any) -> Client:
        app = create_app(make_config(**overrides), with_sandboxes=with_sandboxes)
        client: Client = await aiohttp_client(app)
        clients.append(client)
        return client

    yield make
    for client in reversed(clients):
        await close_or_show_tasks(client)


@pytest.fixture
def make_sandbox_client(test_prefix: str, make_client: ClientFactory) -> ClientFactory:
    """An app with its sandboxes on real Docker, under this test's container prefix (its
    containers, volumes and networks are removed after the test, once its apps have closed:
    test_prefix is set up first, so torn down last); `overrides` go to the configuration."""

    async def make(**overrides: Any) -> Client:
        return await make_client(
            with_sandboxes=True, **({"container_prefix": test_prefix} | overrides)
        )

    return make


@pytest.fixture
async def sbx(make_sandbox_client: ClientFactory) -> Client:
    """A client of an app with sandboxes and the default configuration (modules that need
    another one define their own `sbx` with make_sandbox_client)."""
    return await make_sandbox_client()


@pytest.fixture
async def client(make_client: ClientFactory) -> Client:
    return await make_client()


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"X-Session-API-Key": BOOTSTRAP_KEY}


@pytest.fixture
async def user_headers(raw_redis: aioredis.Redis) -> Callable[..., Awaitable[dict[str, str]]]:
    """Create a real API key for a user; returns the headers that carry it."""

    async def make(user: str = "alice", *, admin: bool = False) -> dict[str, str]:
        created = await ApiKeyService(raw_redis, None).create(user, admin=admin)
        return {"X-Session-API-Key": created.key}

    return make
