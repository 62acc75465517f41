"""Fixtures for the agent server tests: the app runs in-process (no Docker).

Needs pytest-aiohttp (``aiohttp_client`` fixture) and asyncio_mode=auto.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.app import create_app
from agent.config import AgentConfig
from tests.support.fake_llm import FakeLLM
from tests.support.types import Client, ClientFactory

# Test modules get these through the fixtures below (never import conftest).
API_KEYS = ("test-key-0", "test-key-1")


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
def state_dir(tmp_path: Path) -> Path:
    """Where the test app persists conversations (ACS_STATE_DIR)."""
    return tmp_path / "state"


@pytest.fixture
def make_agent_client(aiohttp_client: Any, workspace: Path, state_dir: Path) -> ClientFactory:
    """``await make_agent_client(**AgentConfig overrides)``: a client of an agent server app
    (agent/), in this process."""

    async def factory(**overrides: Any) -> Client:
        settings: dict[str, Any] = {
            "workspace": workspace,
            "api_keys": API_KEYS,
            "post_exit_grace": 0.3,
            "state_dir": state_dir,
        }
        settings.update(overrides)
        client: Client = await aiohttp_client(create_app(AgentConfig(**settings)))
        return client

    return factory


@pytest.fixture
async def agent_client(make_agent_client: ClientFactory) -> Client:
    return await make_agent_client()


@pytest.fixture
async def local_fake_llm() -> AsyncIterator[FakeLLM]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (see tests/support/fake_llm.py)."""
    fake = FakeLLM()
    await fake.start()
    yield fake
    await fake.close()
