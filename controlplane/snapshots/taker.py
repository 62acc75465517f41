"""Taking one snapshot, as steps: record it PENDING (its lease renewed while it is taken), read
the sandbox's files through the runtime (held still for a moment, told to the sandbox's record
so that the reconciler knows), write what changed since the parent, send its index and its
manifest, and commit it READY in one script; or, on any failure, abandon it (what it sent is
collected).

The manifest is an OCI image manifest (artifactType application/vnd.acs.snapshot.v1): its config
is the sealed index and its layers the packs it uses, so the registry's own tools (garbage
collection, replication) see what belongs to it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import structlog

from controlplane.agent_protocol.kinds import STATE_DIR
from controlplane.errors import Conflict, QuotaExceeded
from controlplane.ids import uuid7_hex
from controlplane.sandboxes.models import SandboxRecord
from controlplane.sandboxes.store import SandboxStore
from controlplane.snapshots.index import SnapshotIndex
from controlplane.snapshots.models import SnapshotRecord, SnapshotStatus
from controlplane.snapshots.reader import RESTORED
from controlplane.snapshots.registry import MANIFEST_TYPE, digest_of, manifest_bytes
from controlplane.snapshots.sources import SnapshotData
from controlplane.snapshots.store import SnapshotLimits
from controlplane.snapshots.tee import Tee
from controlplane.snapshots.writer import SnapshotWriter, Written
from drivers.base import FileItem, LocalCopy, SandboxFiles

log = structlog.get_logger(__name__)
ARTIFACT = "application/vnd.acs.snapshot.v1"
INDEX_TYPE = "application/vnd.acs.snapshot.index.v1+sealed"
PACK_TYPE = "application/vnd.acs.snapshot.pack.v1+sealed"
HOLD_FOR = 6.0
"""A sandbox frozen by a snapshot is marked held until now + this, pushed while it lasts; the
reconciler thaws one found frozen past its mark (the control plane holding it died)."""


class Stale(Exception):
    """A pack the snapshot reuses was collected meanwhile: take it again."""


class _Hold:
    """The drivers' Hold: the sandbox's record says it is held still, and until when (pushed
    on every HOLD_FOR / 3 while it lasts)."""

    def __init__(self, sandboxes: SandboxStore, sandbox_id: str) -> None:
        self._sandboxes = sandboxes
        self._id = sandbox_id
        self._renewing: asyncio.Task[None] | None = None

    async def begin(self) -> None:
        await self._sandboxes.hold(self._id, time.time() + HOLD_FOR)
        self._renewing = asyncio.create_task(self._renew(), name=f"hold-{self._id}")
        log.info("snapshot_freeze", sandbox_id=self._id)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(HOLD_FOR / 3)
            await self._sandboxes.hold(self._id, time.time() + HOLD_FOR)

    async def end(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
        await asyncio.shield(self._sandboxes.hold(self._id, None))


class Taker:
    def __init__(
        self,
        data: SnapshotData,
        sandboxes: SandboxStore,
        *,
        lease: float,
        pack_bytes: int,
        max_changed_bytes: int | None = None,
        settle: float = 0.0,
    ) -> None:
        """`settle`: seconds after an abandon during which the store may still land what the
        snapshot was sending (ACS_SNAPSHOT_UPLOAD_SETTLE; the collector's deletions)."""
        self._data = data
        self._sandboxes = sandboxes
        self._lease = lease
        self._pack_bytes = pack_bytes
        self._max_changed_bytes = max_changed_bytes
        self._settle = settle

    async def take(
        self,
        files: SandboxFiles,
        sandbox: SandboxRecord,
        working_dir: str,
        name: str | None,
        limits: SnapshotLimits,
        *,
        captured: asyncio.Event | None = None,
        local_image: str | None = None,
        fork_ids: Sequence[str] = (),
        based: Callable[[str], None] | None = None,
    ) -> SnapshotRecord:
        """The new READY snapshot. Raises QuotaExceeded, Stale, StoreUnavailable, what the
        runtime raises; nothing is left listed, and what was sent is collected. `captured` is
        set once the files are read at their consistent moment (the sandbox thawed), before
        they are sent: from then on the sandbox may change without changing the snapshot.
        `local_image` (a fork's: the spec's image), on a runtime that keeps a shared copy of a
        snapshot's files (SandboxFiles.builds_locally): that copy is built from the export as
        it streams, beside the writer, so that the forks start without reading the store (the
        export then reads every file: the copy needs them all); `fork_ids`: the sandboxes to
        be made from it, whose own directories in that copy are made with it; `based` is
        called with the snapshot's id once that copy is built, while the store may still be
        sealing it (a fork starts its sandboxes then: SnapshotService.fork)."""
        if local_image is not None and not files.builds_locally:
            local_image = None
        store = self._data.store
        started = time.monotonic()
        parent, previous = await self._parent(sandbox)
        snapshot_id = uuid7_hex()
        record = SnapshotRecord(
            id=snapshot_id,
            owner=sandbox.owner,
            sandbox_id=sandbox.id,
            spec_id=sandbox.spec_id,
            status=SnapshotStatus.PENDING,
            name=name,
            parent=parent if previous is not None else None,
            created_at=datetime.now(UTC),
            repository=self._data.repository(sandbox.owner),
        )
        marks = [("begin", started), ("prepare", time.monotonic())]
        async with self._pending(record):
            writer = SnapshotWriter(
                self._data.keys(sandbox.owner),
                self._data.registry,
                record.repository,
                lookup=lambda ids: store.chunk_locations(sandbox.owner, ids),
                record=lambda digest: store.uploading(snapshot_id, "blob", digest),
                previous=previous,
                pack_bytes=self._pack_bytes,
            )
            hold = _Hold(self._sandboxes, sandbox.id)
            known = previous.known() if previous is not None and local_image is None else {}
            copy = None if local_image is None else _Copy(based)
            listed = False
            try:
                async with files.export(
                    sandbox.id,
                    known,
                    working_dir=working_dir,
                    state_paths=(STATE_DIR,),
                    hold=hold,
                    max_bytes=self._max_changed_bytes,
                    local=None
                    if local_image is None
                    else LocalCopy(snapshot_id, local_image, tuple(fork_ids)),
                ) as export:
                    marks.append(("export", time.monotonic()))
                    if captured is not None:
                        captured.set()
                    log.info("snapshot_thawed", sandbox_id=sandbox.id, held=export.held_still)
                    if copy is None or local_image is None:
                        written = await writer.write(export.items)
                    else:
                        written = await copy.write(
                            writer,
                            files,
                            export.items,
                            snapshot_id,
                            image=local_image,
                            fork_ids=fork_ids,
                        )
                marks.append(("write", time.monotonic()))
                if copy is not None and copy.ahead:
                    # Sandboxes stand on the copy already: a copy that failed after all (its
                    # stream broke) fails the snapshot before it is listed, not after.
                    await copy.built()
                record = await self._finish(record, written, export.held_still)
                marks.append(("finish", time.monotonic()))
                outcome = await store.commit(record, written.new_packs, written.new_chunks, limits)
                marks.append(("commit", time.monotonic()))
                if copy is not None:
                    await _built(copy.built(), snapshot_id)
                    marks.append(("local", time.monotonic()))
                log.info(
                    "snapshot_phases",
                    snapshot_id=snapshot_id,
                    **{f"{b[0]}_s": round(b[1] - a[1], 3) for a, b in itertools.pairwise(marks)},
                )
                _check(outcome, snapshot_id, limits, ahead=copy is not None and copy.ahead)
                listed = True
            finally:
                if copy is not None and not listed:
                    await copy.drop(files, snapshot_id)
        self._data.remember(snapshot_id, written.index)
        committed = await store.get(snapshot_id)  # with what the commit counted
        return committed or record

    async def _parent(self, sandbox: SandboxRecord) -> tuple[str | None, SnapshotIndex | None]:
        """The snapshot to take this one against, and its index: the sandbox's latest, unless
        its files came from `origin` since (a rewind: the files that changed between the two
        are the origin's, whose signatures the restore carried, and need no reading); for a
        sandbox's first, the one it was made from. Either is correct (an export reads whatever
        its known signatures do not match): the choice is only what it has to read."""
        latest = await self._data.store.latest(sandbox.id)
        candidates = [latest, sandbox.origin]
        if latest is not None and sandbox.origin is not None and sandbox.origin_at is not None:
            record = await self._data.store.get(latest)
            if record is not None and record.created_at < sandbox.origin_at:
                candidates.reverse()
        for candidate in candidates:
            previous = await self._previous(candidate, sandbox.owner)
            if previous is not None:
                return candidate, previous
        return None, None

    async def _previous(self, parent: str | None, owner: str) -> SnapshotIndex | None:
        """The parent's index, against which only changes are sent; None (everything is
        read again) when it is gone, cannot be read or is not `owner`'s (unchanged files are
        stored as references to the parent's packs: never to another user's)."""
        if parent is None:
            return None
        record = await self._data.store.get(parent)
        if record is None or record.status != SnapshotStatus.READY or record.owner != owner:
            return None
        try:
            return await self._data.index(record)
        except Exception as exc:  # a damaged parent only costs a full read
            log.warning("snapshot_parent_unreadable", snapshot_id=parent, error=str(exc))
            return None

    @asynccontextmanager
    async def _pending(self, record: SnapshotRecord) -> AsyncIterator[None]:
        """PENDING while inside, its lease renewed; abandoned unless committed."""
        store = self._data.store
        await store.begin(record, self._lease)

        async def renew() -> None:
            while True:
                await asyncio.sleep(self._lease / 3)
                await store.renew(record.id, self._lease)

        renewing = asyncio.create_task(renew(), name=f"snapshot-lease-{record.id}")
        try:
            yield
        except BaseException:
            await asyncio.shield(store.abandon(record, self._settle))
            raise
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    async def _finish(
        self, record: SnapshotRecord, written: Written, held: float
    ) -> SnapshotRecord:
        """Send the sealed index and the manifest; the record with what they are."""
        store, registry = self._data.store, self._data.registry
        index = written.index
        sealed = self._data.keys(record.owner).seal_index(record.id, index.encode())
        index_digest = digest_of(sealed)
        await store.uploading(record.id, "blob", index_digest)
        await registry.put_blob(record.repository, sealed)
        packs = index.packs()
        sizes = {p.digest: p.size for p in written.new_packs}
        sizes.update(await store.pack_sizes(record.owner, [p for p in packs if p not in sizes]))
        manifest = _manifest(index_digest, len(sealed), [(p, sizes.get(p, 0)) for p in packs])
        await store.uploading(record.id, "manifest", digest_of(manifest_bytes(manifest)))
        manifest_digest = await registry.put_manifest(record.repository, record.id, manifest)
        record = record.model_copy(
            update={
                "size": index.size,
                "files": len(index.entries),
                "index_digest": index_digest,
                "index_size": len(sealed),
                "manifest_digest": manifest_digest,
                "packs": packs,
                "held_still": round(held, 4),
                "read": written.read,
            }
        )
        await store.fill(record.id, store.encode(record))
        return record


def _check(outcome: str, snapshot_id: str, limits: SnapshotLimits, *, ahead: bool) -> None:
    """Raise unless the commit's outcome is "ok" (`ahead`: sandboxes stand on this take's
    local copy, so it is not taken again: their caller withdraws them)."""
    if outcome == "stale" and ahead:
        raise Conflict("data this fork's snapshot reused was collected meanwhile; retry")
    if outcome == "stale":
        raise Stale()
    if outcome in ("count", "bytes"):
        raise _quota(outcome, limits)
    if outcome != "ok":
        raise Conflict(f"snapshot {snapshot_id} was abandoned while it was taken")


class _Copy:
    """A fork's local copy of the snapshot, built beside the writer from the export's stream
    (`_branch`), and whether `based` was told it is ready (`ahead`: sandboxes may be made on
    it from then on, before the snapshot is listed)."""

    def __init__(self, based: Callable[[str], None] | None) -> None:
        self._based = based
        self._building: asyncio.Task[None] | None = None
        self.ahead = False

    def _told(self, key: str) -> None:
        if self._based is not None:
            self.ahead = True
            self._based(key)

    async def write(
        self,
        writer: SnapshotWriter,
        files: SandboxFiles,
        items: AsyncIterator[FileItem],
        snapshot_id: str,
        *,
        image: str,
        fork_ids: Sequence[str],
    ) -> Written:
        tee, self._building = _branch(files, items, snapshot_id, image, fork_ids, based=self._told)
        try:
            written = await writer.write(tee.main())
        finally:
            tee.close()
        log.info(
            "snapshot_write_waits",
            snapshot_id=snapshot_id,
            stream_wait_s=round(tee.stream_waited, 3),
            base_lag_s=round(tee.main_waited, 3),
        )
        return written

    async def built(self) -> None:
        """Wait for the copy's build (raises as it does)."""
        if self._building is not None:
            await self._building

    async def drop(self, files: SandboxFiles, snapshot_id: str) -> None:
        """The snapshot is not listed: the copy made of it goes too (nothing can start from
        it), but, where `based` was told, only once the sandboxes made on it are withdrawn, by
        its caller (SnapshotService._fork): removed now, it would be pulled from under
        sandboxes still being made on it."""
        if self._building is None:
            return
        self._building.cancel()
        await asyncio.gather(self._building, return_exceptions=True)
        if not self.ahead:
            await asyncio.shield(files.forget(snapshot_id))


def _branch(
    files: SandboxFiles,
    items: AsyncIterator[FileItem],
    snapshot_id: str,
    image: str,
    fork_ids: Sequence[str],
    *,
    based: Callable[[str], None],
) -> tuple[Tee, asyncio.Task[None]]:
    """The export's stream teed: the local copy's build started on its branch (`based` told
    once sandboxes can be made on it: on Docker at the export's end, while the stream still
    goes to the store; a failed build tells nothing, and the forks then start once the
    snapshot is listed, from the store)."""
    # What a plain restore gets (never the state tree: reader.RESTORED).
    tee = Tee(items, lambda entry: entry.tree in RESTORED)
    building = asyncio.create_task(
        files.build_local(snapshot_id, image, tee.branch(), fork_ids, lambda: based(snapshot_id)),
        name=f"local-base-{snapshot_id}",
    )
    return tee, building


async def _built(building: Awaitable[None], snapshot_id: str) -> None:
    """Wait for the local copy's build; its failure costs only speed (the forks then read
    the store, as any restore does), never the snapshot."""
    try:
        await building
    except Exception as exc:
        log.warning("snapshot_local_copy_failed", snapshot_id=snapshot_id, error=str(exc))


def _quota(outcome: str, limits: SnapshotLimits) -> QuotaExceeded:
    if outcome == "count":
        return QuotaExceeded(
            f"you have {limits.count} snapshots (the per-user limit); delete some, then retry",
            retry_after=60,
        )
    return QuotaExceeded(
        f"your snapshots would take more than {limits.bytes} bytes of the store (the "
        "per-user limit); delete some, then retry",
        retry_after=60,
    )


def _manifest(index: str, index_size: int, packs: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT,
        "config": {"mediaType": INDEX_TYPE, "digest": index, "size": index_size},
        "layers": [{"mediaType": PACK_TYPE, "digest": d, "size": s} for d, s in packs],
    }
