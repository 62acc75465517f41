"""Fixtures of the audit log's tests."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis


@pytest.fixture
def redis(raw_redis: aioredis.Redis) -> aioredis.Redis:
    """The test's real redis-server (raw_redis), by the name the audit store's tests use."""
    return raw_redis
