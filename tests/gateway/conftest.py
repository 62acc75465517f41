"""The scripted OpenAI-compatible model (tests/support/fake_llm.py) the gateway's tests call."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_llm import FakeLLM

LLM_KEY = "sk-gw-SECRET-90f1e2"


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    server = FakeLLM(api_key=LLM_KEY, model="fake-model")
    await server.start()
    yield server
    await server.close()
