"""Taking a conversation's checkpoint at a user's message (the conversations domain's
Checkpoints protocol), keeping the last ACS_CHECKPOINT_KEEP_LAST, and dropping them with their
conversation.

The moment a checkpoint stands for is *before* the message: its files are read (the sandbox
held still for a short moment by the snapshot's freeze) before the message goes to the agent,
so that rewinding to it gives back the workspace and the agent's state as they were when the
user typed it. Only that read is waited for (at most ACS_CHECKPOINT_CAPTURE_WAIT); sending the
snapshot's new chunks to the store, recording the checkpoint and retention go on in the
background while the agent works. A checkpoint that fails or is too slow is given up and
logged: the message goes all the same.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import structlog

from controlplane.background import stop_tasks
from controlplane.checkpoints.models import CheckpointRecord
from controlplane.checkpoints.store import CheckpointStore
from controlplane.config import ServiceConfig
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.events.store import EventStore
from controlplane.ids import uuid7_hex
from controlplane.sandboxes.models import SandboxRecord
from controlplane.settings.service import SettingsService
from controlplane.snapshots.models import SnapshotRecord
from controlplane.snapshots.service import SnapshotService
from controlplane.specs.catalog import SpecCatalog

log = structlog.get_logger(__name__)


class Checkpointer:
    def __init__(
        self,
        config: ServiceConfig,
        store: CheckpointStore,
        snapshots: SnapshotService,
        *,
        events: EventStore,
        conversations: ConversationStore,
        settings: SettingsService,
        catalog: SpecCatalog,
    ) -> None:
        self._config = config
        self._store = store
        self._snapshots = snapshots
        self._events = events
        self._conversations = conversations
        self._settings = settings
        self._catalog = catalog
        self._recording: set[asyncio.Task[None]] = set()

    async def wanted(self, info: AppConversationInfo, sandbox: SandboxRecord) -> bool:
        """On unless its spec or its user turned checkpoints off."""
        spec = self._catalog.find(sandbox.spec_id)
        if spec is None or not spec.checkpoints or not info.created_by_user_id:
            return False
        record = await self._settings.record(info.created_by_user_id)
        return record.settings.enable_checkpoints

    async def at_message(self, info: AppConversationInfo, sandbox: SandboxRecord) -> None:
        """A checkpoint of the conversation's sandbox as it is before the user's message: this
        returns once its files are read (or it was given up); never raises."""
        try:
            if not await self.wanted(info, sandbox):
                return
            await self._take(info, sandbox)
        except Exception as exc:  # a checkpoint never costs the user's message
            log.warning("checkpoint_not_taken", conversation_id=info.id, error=str(exc))

    async def _take(self, info: AppConversationInfo, sandbox: SandboxRecord) -> None:
        started = time.monotonic()
        newest = await self._events.newest(info.id)
        checkpoint_id = uuid7_hex()
        captured = asyncio.Event()
        # Named, so that the snapshots' own retention (unnamed ones per sandbox) leaves it to
        # the checkpoints' (per conversation).
        taking = self._snapshots.begin(sandbox, f"checkpoint {checkpoint_id}", captured)
        waiting = asyncio.create_task(captured.wait())
        try:
            await asyncio.wait(
                {taking, waiting},
                timeout=self._config.checkpoint_capture_wait,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiting.cancel()
        if not captured.is_set():
            # Failed (logged by the snapshot service) or too slow: the message goes without,
            # once the sandbox is thawed (its agent would time out on the message meanwhile).
            failed = taking.done()
            await self._snapshots.cancel(taking)
            log.warning(
                "checkpoint_given_up",
                conversation_id=info.id,
                sandbox_id=sandbox.id,
                waited=round(time.monotonic() - started, 3),
                failed=failed,
            )
            return
        log.info(
            "checkpoint_captured",
            conversation_id=info.id,
            checkpoint_id=checkpoint_id,
            waited=round(time.monotonic() - started, 3),
        )
        record = CheckpointRecord(
            id=checkpoint_id,
            conversation_id=info.id,
            owner=sandbox.owner,
            sandbox_id=sandbox.id,
            snapshot_id="",
            event_id=str(newest[1].get("id")) if newest else None,
            stream_id=newest[0] if newest else None,
            created_at=datetime.now(UTC),
        )
        task = asyncio.create_task(self._record(record, taking), name=f"checkpoint-{record.id}")
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record(self, record: CheckpointRecord, taking: asyncio.Task[SnapshotRecord]) -> None:
        """Once its snapshot is stored: the checkpoint listed, then the oldest beyond the
        retention deleted. A conversation deleted meanwhile takes the snapshot with it."""
        try:
            snapshot = await taking
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("checkpoint_not_stored", checkpoint_id=record.id, error=str(exc))
            return
        record = record.model_copy(update={"snapshot_id": snapshot.id})
        await self._store.add(record)
        if await self._conversations.get(record.conversation_id) is None:
            await self.dropped(record.conversation_id)
            return
        log.info(
            "checkpoint_taken",
            conversation_id=record.conversation_id,
            checkpoint_id=record.id,
            snapshot_id=snapshot.id,
            stored=snapshot.stored,
        )
        await self._retain(record.conversation_id)

    async def _retain(self, conversation_id: str) -> None:
        keep = self._config.checkpoint_keep_last
        records = await self._store.all(conversation_id)
        if not keep or len(records) <= keep:
            return
        doomed = records[: len(records) - keep]
        for record in doomed:
            await self._snapshots.discard(record.owner, record.snapshot_id)
        await self._store.remove(conversation_id, [r.id for r in doomed])
        log.info("checkpoints_retired", conversation_id=conversation_id, count=len(doomed))

    async def dropped(self, conversation_id: str) -> None:
        """The conversation is deleted: its checkpoints and their snapshots go (the snapshots'
        blobs then as the store's collection deletes unused ones)."""
        for record in await self._store.all(conversation_id):
            await self._snapshots.discard(record.owner, record.snapshot_id)
        await self._store.drop(conversation_id)

    async def settle(self) -> None:
        """Wait for the checkpoints being stored (tests, shutdown)."""
        while self._recording:
            await asyncio.gather(*list(self._recording), return_exceptions=True)

    async def close(self) -> None:
        await stop_tasks(list(self._recording))
