"""Fixtures for the agent server tests: the app runs in-process (no Docker).

Needs pytest-aiohttp (``aiohttp_client`` fixture) and asyncio_mode=auto.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # make `agent` importable however pytest is started
    sys.path.insert(0, str(REPO_ROOT))

from aiohttp.test_utils import TestClient  # noqa: E402

from agent.app import create_app  # noqa: E402
from agent.config import AgentConfig  # noqa: E402

# Test modules get these through the fixtures below (never import conftest).
API_KEYS = ("test-key-0", "test-key-1")

ClientFactory = Callable[..., Awaitable[TestClient]]


@pytest.fixture
def api_keys() -> tuple[str, ...]:
    """The session API keys the test app accepts."""
    return API_KEYS


@pytest.fixture
def auth() -> dict[str, str]:
    """Headers carrying a valid session API key."""
    return {"X-Session-API-Key": API_KEYS[0]}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def make_client(aiohttp_client: Any, workspace: Path) -> ClientFactory:
    """``await make_client(**AgentConfig overrides)`` -> TestClient."""

    async def factory(**overrides: Any) -> TestClient:
        settings: dict[str, Any] = {
            "workspace": workspace,
            "api_keys": API_KEYS,
            "post_exit_grace": 0.3,
        }
        settings.update(overrides)
        client: TestClient = await aiohttp_client(create_app(AgentConfig(**settings)))
        return client

    return factory


@pytest.fixture
async def client(make_client: ClientFactory) -> TestClient:
    return await make_client()
