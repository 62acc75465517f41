"""Messages the web frontend queues while a conversation cannot take them yet (its start task
is running, or its socket is closed): kept in Redis, sent to the agent in order, once, when
the conversation runs (docs/conversations.md#pending-messages)."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Annotated, Literal

import redis.asyncio as aioredis
import structlog
from pydantic import BaseModel, ConfigDict, Field

from controlplane.agent_protocol.client import AgentClient
from controlplane.conversations.models import ImageContent, TextContent, now
from controlplane.errors import ControlPlaneError, QuotaExceeded
from controlplane.ids import uuid7_hex
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.service import SandboxService
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.streams import APPEND_ENTRY, script_args, stored

log = structlog.get_logger(__name__)
MAX_PENDING = 10
"""Per conversation, as OpenHands: more is a 429."""
DELIVERY_LOCK_MS = 120_000

Content = Annotated[TextContent | ImageContent, Field(discriminator="type")]


class QueuePendingMessageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user"] = "user"
    content: list[Content] = Field(min_length=1, max_length=50)


class PendingMessage(BaseModel):
    id: str
    conversation_id: str
    role: Literal["user"] = "user"
    content: list[Content]
    created_at: datetime = Field(default_factory=now)


class PendingMessageResponse(BaseModel):
    id: str
    queued: bool = True
    position: int = Field(description="Place in the queue, from 1")


class DeliveryResult(BaseModel):
    delivered: int = Field(description="Messages sent to the agent by this call")
    pending: int = Field(description="Messages still waiting")


# KEYS: the queue. ARGV: message JSON, limit. The new length, or -1 when full.
# KEYS: the queue, then the audit entry's streams. ARGV: the message, the limit, the entry.
_PUSH = (
    APPEND_ENTRY
    + """
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
local length = redis.call('RPUSH', KEYS[1], ARGV[1])
append_entry(2, 3)
return length
"""
)
# KEYS: the queue. ARGV: the message sent. Drop it only if it is still the head.
_DROP_HEAD = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then redis.call('LPOP', KEYS[1]) return 1 end
return 0
"""
# KEYS: from, to. Append every message of `from` to `to`, in order, and drop `from`.
_MOVE_ALL = """
local items = redis.call('LRANGE', KEYS[1], 0, -1)
for _, item in ipairs(items) do redis.call('RPUSH', KEYS[2], item) end
redis.call('DEL', KEYS[1])
return #items
"""
# KEYS: lock. ARGV: token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def task_owner(task_id: str) -> str:
    return f"task-{task_id}"


class PendingMessages:
    def __init__(self, redis: aioredis.Redis, sandboxes: SandboxService, agent: AgentClient):
        self._redis = redis
        self._sandboxes = sandboxes
        self._agent = agent
        self._push = redis.register_script(_PUSH)
        self._drop_head = redis.register_script(_DROP_HEAD)
        self._move_all = redis.register_script(_MOVE_ALL)
        self._release = redis.register_script(_RELEASE)

    async def queue(self, owner: str, body: QueuePendingMessageRequest) -> PendingMessageResponse:
        """Append a message for `owner` (a conversation id or task_owner()). QuotaExceeded when
        MAX_PENDING already wait."""
        message = PendingMessage(
            id=uuid7_hex(), conversation_id=owner, role=body.role, content=body.content
        )
        made = audit.route_entry(AuditAction.PENDING_QUEUE)
        streams, entry_args = script_args(made)
        length = await self._push(
            keys=[keyspace.pending_messages(owner), *streams],
            args=[message.model_dump_json(), MAX_PENDING, *entry_args],
        )
        if length >= 0:
            stored(made)
        if length < 0:
            raise QuotaExceeded(
                f"too many pending messages: at most {MAX_PENDING} per conversation",
                retry_after=5,
            )
        return PendingMessageResponse(id=message.id, position=int(length))

    async def list(self, owner: str) -> list[PendingMessage]:
        raw = await self._redis.lrange(keyspace.pending_messages(owner), 0, -1)
        return [PendingMessage.model_validate_json(text(r)) for r in raw]

    async def count(self, owner: str) -> int:
        return int(await self._redis.llen(keyspace.pending_messages(owner)))

    async def adopt(self, task_id: str, conversation_id: str) -> None:
        """The task became a conversation: its queue joins the conversation's."""
        await self._move_all(
            keys=[
                keyspace.pending_messages(task_owner(task_id)),
                keyspace.pending_messages(conversation_id),
            ]
        )

    async def drop(self, owner: str) -> None:
        await self._redis.delete(keyspace.pending_messages(owner))

    async def deliver(self, conversation_id: str, sandbox_id: str) -> DeliveryResult:
        """Send the queue to the agent, oldest first, when the sandbox is RUNNING. One delivery
        at a time per conversation (a lock in Redis); a message leaves the queue only after
        the agent took it, so a failure leaves it, and the rest, for the next delivery."""
        sandbox = await self._sandboxes.record(sandbox_id)
        if sandbox is None or sandbox.status != SandboxStatus.RUNNING or not sandbox.ports:
            return DeliveryResult(delivered=0, pending=await self.count(conversation_id))
        lock, token = keyspace.pending_delivery(conversation_id), secrets.token_hex(8)
        delivered = 0
        # A message queued while another request held the lock, and left by it, is ours: so
        # look again after releasing, until the queue is empty or someone else delivers.
        while await self._redis.set(lock, token, nx=True, px=DELIVERY_LOCK_MS):
            try:
                sent, failed = await self._drain(conversation_id, sandbox)
                delivered += sent
            finally:
                await self._release(keys=[lock], args=[token])
            if failed or not await self.count(conversation_id):
                break
        if delivered:
            log.info("pending_delivered", conversation_id=conversation_id, count=delivered)
        return DeliveryResult(delivered=delivered, pending=await self.count(conversation_id))

    async def _drain(self, conversation_id: str, sandbox: SandboxRecord) -> tuple[int, bool]:
        """(messages sent, whether one failed), under the delivery lock."""
        queue = keyspace.pending_messages(conversation_id)
        base = self._sandboxes.agent_url(sandbox)
        sent = 0
        while (head := await self._redis.lindex(queue, 0)) is not None:
            message = PendingMessage.model_validate_json(text(head))
            body = {
                "role": message.role,
                "content": [c.model_dump() for c in message.content],
                "run": True,
            }
            try:
                await self._agent.send_message(base, sandbox.session_api_key, conversation_id, body)
            except ControlPlaneError as exc:
                log.warning(
                    "pending_delivery_failed",
                    conversation_id=conversation_id,
                    message_id=message.id,
                    error=str(exc),
                )
                return sent, True
            await self._drop_head(keys=[queue], args=[head])
            sent += 1
        return sent, False
