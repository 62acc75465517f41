"""Sandbox and conversation records written straight to Redis, and the events agents post: for
tests of the webhooks, metrics and lifecycle that need no container (the app's engine is one
that does not answer, NO_ENGINE); a user's record as stored. A plugin of tests/conftest.py: the
`recorded` fixture."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.settings.models import UserRecord
from controlplane.settings.store import UserRecordStore
from tests.support.types import Client, UserHeaders

NO_ENGINE = "tcp://127.0.0.1:1"
"""A Docker URL nothing answers: an app with sandboxes that never reaches an engine."""


async def stored_user_record(client: Client, user: str) -> UserRecord:
    """The user's record as stored, decrypted with the app's own SecretBox."""
    return await UserRecordStore(client.app[keys.REDIS], client.app[keys.SECRET_BOX]).get(user)


def sandbox_record(owner: str, status: SandboxStatus, key: str | None = None) -> SandboxRecord:
    now = datetime.now(UTC)
    return SandboxRecord(
        id=naming.new_sandbox_id(),
        owner=owner,
        spec_id="default",
        status=status,
        session_api_key=key or secrets.token_urlsafe(32),
        created_at=now,
        updated_at=now,
        last_activity_at=now,
    )


def stats(cost: float, prompt: int, completion: int, usage_id: str = "agent") -> dict[str, Any]:
    """The SDK's ConversationStats, as agents send them."""
    return {
        "usage_to_metrics": {
            usage_id: {
                "model_name": "fake-model",
                "accumulated_cost": cost,
                "max_budget_per_task": 5.0,
                "accumulated_token_usage": {
                    "model": "fake-model",
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "per_turn_token": prompt,
                    "response_id": f"r-{prompt}",
                },
            }
        }
    }


def event(
    kind: str = "MessageEvent", when: datetime | None = None, **fields: Any
) -> dict[str, Any]:
    """An event with a naive UTC timestamp, as the SDK writes them."""
    moment = (when or datetime.now(UTC)).replace(tzinfo=None)
    return {
        "id": secrets.token_hex(8),
        "timestamp": moment.isoformat(timespec="microseconds"),
        "source": "agent",
        "kind": kind,
        **fields,
    }


RecordedSandbox = tuple[Client, str, str, dict[str, str], dict[str, str]]


@pytest.fixture
async def recorded(
    make_client: Callable[..., Awaitable[Client]],
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> RecordedSandbox:
    """(client, sandbox id, conversation id, the sandbox's headers, the owner's headers): alice's
    running sandbox as a record without a container, with one conversation (no engine needed to
    reach the webhooks)."""
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    key = secrets.token_urlsafe(32)
    record = sandbox_record("alice", SandboxStatus.RUNNING, key)
    assert await SandboxStore(raw_redis, client.app[keys.SECRET_BOX]).create(record, 0, Limits())
    conversation_id = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=conversation_id, created_by_user_id="alice", sandbox_id=record.id)
    )
    alice = await user_headers("alice")
    return client, record.id, conversation_id, {"X-Session-API-Key": key}, alice
