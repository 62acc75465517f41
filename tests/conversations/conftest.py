"""Fixtures of the conversations' tests shared by more than one module."""

from __future__ import annotations

import pytest

from tests.support.records import NO_ENGINE
from tests.support.types import Client, ClientFactory


@pytest.fixture
async def index_client(make_client: ClientFactory) -> Client:
    """A client with sandboxes on and no engine: the conversations' indexes against a real
    Redis, nothing started."""
    return await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
