"""Who may queue for which conversation: the pending-message routes' service. An id names the
caller's conversation or, before it exists, the caller's start task (`task-<id>`)."""

from __future__ import annotations

from controlplane.auth.models import Principal
from controlplane.conversations.models import AppConversationInfo, StartTaskStatus
from controlplane.conversations.pending import (
    DeliveryResult,
    PendingMessage,
    PendingMessageResponse,
    PendingMessages,
    QueuePendingMessageRequest,
    task_owner,
)
from controlplane.conversations.service import ConversationService
from controlplane.errors import Conflict, NotFound, RuntimeUnavailable


class PendingAccess:
    def __init__(self, conversations: ConversationService) -> None:
        if conversations.pending is None:
            raise RuntimeUnavailable("pending messages are not enabled on this server")
        self._conversations = conversations
        self._queue: PendingMessages = conversations.pending

    async def _target(
        self, principal: Principal, raw_id: str
    ) -> tuple[str, AppConversationInfo | None]:
        """The queue `raw_id` names, and its conversation once there is one. NotFound for
        anyone else's id; Conflict for a start task that failed."""
        if not raw_id.startswith("task-"):
            try:
                info = await self._conversations.owned(principal, raw_id)
                return info.id, info
            except NotFound:
                pass
        task_id = raw_id.removeprefix("task-").replace("-", "").lower()
        task = await self._conversations.task(principal, task_id)
        if task is None:
            raise NotFound(f"conversation {raw_id} not found")
        if task.status == StartTaskStatus.ERROR:
            raise Conflict(f"the conversation of start task {task.id} did not start: {task.detail}")
        if task.status == StartTaskStatus.READY and task.app_conversation_id:
            info = await self._conversations.owned(principal, task.app_conversation_id)
            return info.id, info
        return task_owner(task.id), None

    async def queue(
        self, principal: Principal, raw_id: str, body: QueuePendingMessageRequest
    ) -> PendingMessageResponse:
        owner, info = await self._target(principal, raw_id)
        queued = await self._queue.queue(owner, body)
        if info is None:
            # The start task may have finished meanwhile. It hands its queue over after READY,
            # so a push it missed is seen READY here and handed over by us.
            store = self._conversations.store
            task = await store.get_task(owner.removeprefix("task-"))
            if task is not None and task.status == StartTaskStatus.ERROR:
                await self._queue.drop(owner)
                raise Conflict(f"the conversation of start task {task.id} did not start")
            if task is None or task.status != StartTaskStatus.READY or not task.app_conversation_id:
                return queued
            await self._queue.adopt(task.id, task.app_conversation_id)
            info = await store.get(task.app_conversation_id)
        if info is not None:
            await self._queue.deliver(info.id, info.sandbox_id)
        return queued

    async def list(self, principal: Principal, raw_id: str) -> list[PendingMessage]:
        owner, _info = await self._target(principal, raw_id)
        return await self._queue.list(owner)

    async def deliver(self, principal: Principal, raw_id: str) -> DeliveryResult:
        owner, info = await self._target(principal, raw_id)
        if info is None:
            return DeliveryResult(delivered=0, pending=await self._queue.count(owner))
        return await self._queue.deliver(info.id, info.sandbox_id)
