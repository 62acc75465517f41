"""The snapshot collector: one replica at a time (a Redis leader lock), every
ACS_SNAPSHOT_COLLECT_INTERVAL seconds:

1. snapshots abandoned while taken (their lease lapsed: a replica died) are forgotten, and what
   they sent goes to the store's deletions; the sandboxes a fork started from one before its
   listing (keyspace.snapshot_forks) are deleted with it;
2. retention: per sandbox, unnamed snapshots beyond the last ACS_SNAPSHOT_KEEP_LAST or older
   than ACS_SNAPSHOT_MAX_AGE, and those of a sandbox deleted ACS_SNAPSHOT_ORPHAN_RETENTION ago,
   are deleted (named ones are kept until deleted);
3. packs no snapshot has used for ACS_SNAPSHOT_COLLECT_GRACE are forgotten (unless a snapshot
   reused them meanwhile), into the store's deletions;
4. the store's deletions are carried out (blobs and manifests deleted from the registry), each
   forgotten only once the registry confirmed it;
5. what operations killed in the middle left on the runtime (helper containers, unfinished
   bases) is removed (drivers/base.py: SandboxFiles.sweep).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

import structlog

from controlplane.config import ServiceConfig
from controlplane.errors import ControlPlaneError
from controlplane.sandboxes.store import SandboxStore
from controlplane.snapshots.models import SnapshotRecord, SnapshotStatus
from controlplane.snapshots.sources import SnapshotData
from controlplane.store.leader import LeaderLock, LeaderLoop
from drivers.base import SandboxFiles

log = structlog.get_logger(__name__)
PAGE = 200
SWEEP_AFTER = 600.0
"""Seconds after which a helper object not in use is taken for a leftover: longer than any
engine operation on one (an archive extracted, an image committed)."""


class Collector:
    def __init__(
        self,
        config: ServiceConfig,
        data: SnapshotData,
        sandboxes: SandboxStore,
        *,
        remove: Callable[[SnapshotRecord], Awaitable[None]],
        withdraw: Callable[[Sequence[str], str], Awaitable[None]] | None = None,
        leader: LeaderLock,
        files: SandboxFiles | None = None,
    ) -> None:
        self._config = config
        self._data = data
        self._sandboxes = sandboxes
        self._remove = remove
        self._withdraw = withdraw
        self._files = files
        self._loop = LeaderLoop(
            "snapshot_collection", leader, self.collect, lambda: config.snapshot_collect_interval
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def collect(self, now: float | None = None) -> dict[str, int]:
        """One pass; what it did, by kind."""
        at = time.time() if now is None else now
        done = {
            "abandoned": await self._abandoned(at),
            "withdrawn": await self._forks_of_abandoned(),
            "retired": await self._retention(at),
            # Now again: what retention just doomed counts from its own time.
            "packs": await self._packs(time.time() if now is None else now),
        }
        done["deleted"] = await self.carry_out_deletions()
        if self._files is not None:  # what operations killed in the middle left on the runtime
            done["runtime"] = await self._files.sweep(SWEEP_AFTER)
        if any(done.values()):
            log.info("snapshots_collected", **done)
        return done

    async def _abandoned(self, now: float) -> int:
        store = self._data.store
        count = 0
        for snapshot_id in await store.abandoned(now):
            record = await store.get(snapshot_id)
            if record is None or record.status != SnapshotStatus.PENDING:
                await store.unlist_pending(snapshot_id)
                continue
            await store.abandon(record, self._config.snapshot_upload_settle)
            log.info("snapshot_abandoned", snapshot_id=snapshot_id, sandbox_id=record.sandbox_id)
            count += 1
        return count

    async def _forks_of_abandoned(self) -> int:
        """The sandboxes a fork started from its snapshot before the listing, deleted when that
        snapshot is gone unlisted (abandoned: the replica forking died); forgotten once it is
        listed (the replica died after the listing, before it forgot them)."""
        store = self._data.store
        count = 0
        for snapshot_id in await store.forked_ahead():
            record = await store.get(snapshot_id)
            if record is not None and record.status == SnapshotStatus.PENDING:
                continue  # still being taken (or to be abandoned first)
            if record is None and self._withdraw is not None:
                forks = await store.forks_of(snapshot_id)
                try:
                    await self._withdraw(
                        forks, f"its fork's snapshot {snapshot_id} was not stored; nothing was kept"
                    )
                except Exception as exc:  # the next pass withdraws what is left (the rest goes on)
                    log.warning("fork_not_withdrawn", snapshot_id=snapshot_id, error=str(exc))
                    continue
                log.info("fork_withdrawn", snapshot_id=snapshot_id, sandbox_ids=forks)
                count += len(forks)
                if self._files is not None:
                    try:
                        await self._files.forget(snapshot_id)
                    except Exception as exc:  # held by the dead replica's helper: the sweep's
                        log.warning("fork_base_kept", snapshot_id=snapshot_id, error=str(exc))
            await store.drop_forks(snapshot_id)
        return count

    async def _packs(self, now: float) -> int:
        store = self._data.store
        count = 0
        for owner, digest in await store.doomed(now - self._config.snapshot_collect_grace):
            if await store.collect_pack(owner, digest, self._data.repository(owner)):
                count += 1
        return count

    async def carry_out_deletions(self) -> int:
        """Delete from the registry what no snapshot uses; the count deleted. A registry that
        does not answer leaves the rest for the next pass. What an abandoned snapshot was
        sending and the store says it does not hold is asked again at the next passes until it
        has settled (ACS_SNAPSHOT_UPLOAD_SETTLE): an upload whose bytes the store had when its
        sender gave up (a connection cut after the body, a cancel, a replica's death) may still
        land after this "not there", and would then be linked with nothing to delete it."""
        store, registry = self._data.store, self._data.registry
        deletions = await store.deletions()
        # Read after the deletions: an abandon writes both at once, so every deletion seen
        # has its settle seen too (read before, an abandon landing in between would not).
        settling = await store.settling()
        now = time.time()
        count = 0
        for repository, kind, digest in deletions:
            try:
                if kind == "manifest":
                    found = await registry.delete_manifest(repository, digest)
                else:
                    found = await registry.delete_blob(repository, digest)
            except ControlPlaneError as exc:
                log.warning("snapshot_store_delete_failed", digest=digest, error=str(exc))
                break
            if not found and settling.get((repository, kind, digest), 0.0) > now:
                continue  # it may still land: asked again at the next pass
            await store.deleted(repository, kind, digest)
            count += 1
        return count

    # -- retention ------------------------------------------------------------------------------

    async def _retention(self, now: float) -> int:
        store = self._data.store
        retired = 0
        after: str | None = None
        while True:
            sandbox_ids = await store.sandboxes_page(after, PAGE)
            for sandbox_id in sandbox_ids:
                retired += await self._retire_of(sandbox_id, now)
            if len(sandbox_ids) < PAGE:
                return retired
            after = sandbox_ids[-1]

    async def _retire_of(self, sandbox_id: str, now: float) -> int:
        """Apply the retention rules to one sandbox's snapshots; how many were deleted."""
        store, config = self._data.store, self._config
        records = [r for r in await store.get_many(await store.sandbox_ids(sandbox_id)) if r]
        gone = await self._sandboxes.get(sandbox_id) is None
        if not records:
            if gone:
                await store.drop_sandbox_index(sandbox_id)
            return 0
        unnamed = [r for r in records if r.name is None]  # oldest first
        doomed: list[SnapshotRecord] = []
        if config.snapshot_keep_last:
            doomed += unnamed[: max(0, len(unnamed) - config.snapshot_keep_last)]
        if config.snapshot_max_age:
            oldest = datetime.fromtimestamp(now, UTC) - timedelta(seconds=config.snapshot_max_age)
            doomed += [r for r in unnamed if r.created_at < oldest]
        if gone and now - await store.orphaned_since(sandbox_id, now) >= (
            config.snapshot_orphan_retention
        ):
            doomed += unnamed
        retired = 0
        for record in {r.id: r for r in doomed}.values():
            await self._remove(record)
            log.info("snapshot_retired", snapshot_id=record.id, sandbox_id=sandbox_id)
            retired += 1
        return retired
