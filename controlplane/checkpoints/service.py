"""A conversation's checkpoints for its user: list them, rewind the conversation to one, fork
a new conversation from one (docs/sandboxes.md#checkpoints). Taking them is taking.py's."""

from __future__ import annotations

import structlog

from controlplane.api.pagination import HEX32, decode_cursor, encode_cursor
from controlplane.auth.models import Principal
from controlplane.checkpoints.models import (
    CheckpointInfo,
    CheckpointPage,
    CheckpointQuery,
    CheckpointRecord,
    ForkConversationRequest,
    ForkConversationResult,
    RewindResult,
)
from controlplane.checkpoints.store import CheckpointStore
from controlplane.conversations.models import AppConversationInfo, AppConversationStartRequest
from controlplane.conversations.service import ConversationService
from controlplane.conversations.store import ConversationStore
from controlplane.errors import CheckpointNotFound, Conflict, SnapshotNotFound
from controlplane.events.store import EventStore
from controlplane.ids import uuid7_hex
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.service import SandboxService
from controlplane.snapshots.service import SnapshotService

log = structlog.get_logger(__name__)

FORK_MARK = " (fork)"
TITLE_CHARS = 200
"""The most a start request's title holds (AppConversationStartRequest)."""


def fork_title(source: str | None) -> str:
    """A fork's title when its request names none: the source's, marked, cut so that the mark
    fits (a source titled up to the limit would make the start request invalid: a 500 after
    the fork's sandbox was started)."""
    return (source or "Conversation")[: TITLE_CHARS - len(FORK_MARK)] + FORK_MARK


def info(record: CheckpointRecord) -> CheckpointInfo:
    return CheckpointInfo(
        id=record.id,
        conversation_id=record.conversation_id,
        sandbox_id=record.sandbox_id,
        snapshot_id=record.snapshot_id,
        event_id=record.event_id,
        created_at=record.created_at,
    )


class CheckpointService:
    def __init__(
        self,
        store: CheckpointStore,
        conversations: ConversationService,
        *,
        records: ConversationStore,
        events: EventStore,
        sandboxes: SandboxService,
        snapshots: SnapshotService,
    ) -> None:
        self._store = store
        self._conversations = conversations
        self._records = records
        self._events = events
        self._sandboxes = sandboxes
        self._snapshots = snapshots

    async def search(
        self, principal: Principal, conversation_id: str, query: CheckpointQuery
    ) -> CheckpointPage:
        """The conversation's checkpoints, newest first. Raises NotFound (not the caller's)."""
        conversation = await self._own(principal, conversation_id)
        before = decode_cursor(query.page_id, HEX32)
        records = [
            r
            for r in reversed(await self._store.all(conversation.id))
            if before is None or r.id < before
        ]
        page = records[: query.limit]
        more = len(records) > query.limit
        return CheckpointPage(
            items=[info(r) for r in page],
            next_page_id=encode_cursor(page[-1].id) if more else None,
        )

    async def rewind(
        self, principal: Principal, conversation_id: str, checkpoint_id: str
    ) -> RewindResult:
        """The conversation's sandbox made again from the checkpoint, files and the agent's
        state, keeping its ids (in the background: STARTING, then RUNNING); the events after
        the checkpoint kept and marked `rewound_by`. Raises NotFound, CheckpointNotFound,
        Conflict (its snapshot is gone, the sandbox holds other conversations or cannot be
        rewound now), StoreUnavailable (snapshots off), QuotaExceeded."""
        conversation, checkpoint = await self._checkpoint(principal, conversation_id, checkpoint_id)
        if checkpoint.sandbox_id != conversation.sandbox_id:
            raise Conflict(
                f"checkpoint {checkpoint_id} was taken of sandbox {checkpoint.sandbox_id}, not "
                "of the conversation's sandbox: fork from it instead"
            )
        others = await self._records.ids_in_sandbox(conversation.sandbox_id) - {conversation.id}
        if others:
            raise Conflict(
                f"the conversation's sandbox holds {len(others)} other conversation(s), which a "
                "rewind would rewind too: fork from the checkpoint instead"
            )
        # Frozen first (no event arrives from the old agent after the marks), then replaced.
        await self._sandboxes.rewind(principal, conversation.sandbox_id, checkpoint.snapshot_id)
        rewound = await self._events.mark_rewound(
            conversation.id, checkpoint.stream_id or "0", checkpoint.id
        )
        log.info(
            "conversation_rewound",
            conversation_id=conversation.id,
            checkpoint_id=checkpoint.id,
            rewound_events=rewound,
        )
        return RewindResult(
            checkpoint=info(checkpoint),
            sandbox_id=conversation.sandbox_id,
            sandbox_status=SandboxStatus.STARTING,
            rewound_events=rewound,
        )

    async def fork(
        self, principal: Principal, conversation_id: str, body: ForkConversationRequest
    ) -> ForkConversationResult:
        """A new conversation of the caller's, in a new sandbox made from the checkpoint (its
        own id, session key and gateway token), with the conversation's history up to there;
        the agent goes on from the source's stored conversation at the checkpoint (its events,
        carried under the new id; not its credentials). Raises as
        `rewind`, and QuotaExceeded when the caps refuse a sandbox (then nothing is made)."""
        conversation, checkpoint = await self._checkpoint(
            principal, conversation_id, body.checkpoint_id
        )
        fork_id = uuid7_hex()
        (sandbox,) = await self._sandboxes.start_from(
            principal, checkpoint.snapshot_id, 1, carried=f"{conversation.id}:{fork_id}"
        )
        try:
            copied = await self._events.copy(conversation.id, fork_id, checkpoint.stream_id)
            task = await self._conversations.start(
                principal,
                AppConversationStartRequest(
                    sandbox_id=sandbox.id,
                    conversation_id=fork_id,
                    title=body.title or fork_title(conversation.title),
                    llm_model=conversation.llm_model,
                    selected_repository=conversation.selected_repository,
                    selected_branch=conversation.selected_branch,
                    git_provider=conversation.git_provider,
                ),
            )
        except BaseException:
            await self._events.delete(fork_id)
            await self._sandboxes.delete(principal, sandbox.id)
            raise
        log.info(
            "conversation_forked",
            conversation_id=conversation.id,
            checkpoint_id=checkpoint.id,
            fork_id=fork_id,
            sandbox_id=sandbox.id,
        )
        return ForkConversationResult(
            checkpoint=info(checkpoint),
            conversation_id=fork_id,
            sandbox_id=sandbox.id,
            copied_events=copied,
            start_task=task,
        )

    async def _own(self, principal: Principal, conversation_id: str) -> AppConversationInfo:
        """The caller's own conversation (an admin reads others', but rewinds and forks only
        their own: a checkpoint's files are its user's)."""
        conversation = await self._conversations.owned(principal, conversation_id)
        if conversation.created_by_user_id != principal.user_id:
            raise CheckpointNotFound(f"conversation {conversation_id} has no checkpoint of yours")
        return conversation

    async def _checkpoint(
        self, principal: Principal, conversation_id: str, checkpoint_id: str
    ) -> tuple[AppConversationInfo, CheckpointRecord]:
        conversation = await self._own(principal, conversation_id)
        checkpoint = await self._store.get(conversation.id, checkpoint_id)
        if checkpoint is None:
            raise CheckpointNotFound(
                f"checkpoint {checkpoint_id} not found in conversation {conversation_id}"
            )
        try:
            await self._snapshots.get(principal, checkpoint.snapshot_id)
        except SnapshotNotFound:
            raise Conflict(
                f"checkpoint {checkpoint_id}'s snapshot {checkpoint.snapshot_id} was deleted"
            ) from None
        return conversation, checkpoint
