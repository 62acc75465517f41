"""Writing a snapshot: an export's stream (drivers/base.py: FileItem) cut into chunks, each
stored once per user (its keyed id looked up among the user's chunks), sealed, and packed into
blobs of about ACS_SNAPSHOT_PACK_BYTES sent to the store.

Unchanged files (the export sends no bytes for them) keep the chunks of the previous index.
Every blob is recorded with the pending snapshot before it is sent, so an abandoned snapshot's
blobs are found and deleted (store.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from controlplane.errors import StoreUnavailable
from controlplane.snapshots.index import CHUNK, ChunkRef, SnapshotIndex
from controlplane.snapshots.registry import Registry, digest_of
from controlplane.snapshots.sealing import UserKeys
from controlplane.snapshots.store import NewPack
from drivers.base import FileEntry, FileItem, FileKind

LOOKUP_BATCH = 256
"""Chunks whose ids are looked up in Redis in one round trip."""
UPLOADS_IN_FLIGHT = 2

Lookup = Callable[[list[str]], Awaitable[list[str | None]]]
Recorder = Callable[[str], Awaitable[None]]


@dataclass
class _Slot:
    """Where one chunk is; a chunk sealed in this snapshot learns its pack when the pack is."""

    id: str
    pack: str = ""
    offset: int = 0
    length: int = 0

    def ref(self) -> ChunkRef:
        return ChunkRef(self.id, self.pack, self.offset, self.length)


@dataclass
class Written:
    index: SnapshotIndex
    new_packs: list[NewPack] = field(default_factory=list)
    new_chunks: dict[str, str] = field(default_factory=dict)  # id -> "<pack> <offset> <length>"
    read: int = 0  # bytes of the changed files the export sent


class _Packer:
    """Sealed chunks gathered into packs; each full pack sent (a few at once)."""

    def __init__(self, registry: Registry, repo: str, record: Recorder, pack_bytes: int) -> None:
        self._registry = registry
        self._repo = repo
        self._record = record
        self._limit = pack_bytes
        self._parts: list[bytes] = []
        self._slots: list[_Slot] = []
        self._size = 0
        self._sending: set[asyncio.Task[str]] = set()
        self.packs: list[NewPack] = []
        self.placed: list[_Slot] = []

    async def add(self, slot: _Slot, sealed: bytes) -> None:
        slot.offset, slot.length = self._size, len(sealed)
        self._parts.append(sealed)
        self._slots.append(slot)
        self._size += len(sealed)
        if self._size >= self._limit:
            await self.seal_pack()

    async def seal_pack(self) -> None:
        if not self._parts:
            return
        data = b"".join(self._parts)
        digest = digest_of(data)
        for slot in self._slots:
            slot.pack = digest
        self.placed.extend(self._slots)
        self.packs.append(NewPack(digest, len(data), [slot.id for slot in self._slots]))
        self._parts, self._slots, self._size = [], [], 0
        while len(self._sending) >= UPLOADS_IN_FLIGHT:
            await self._first_done()
        await self._record(digest)  # before it is sent: an abandoned one is found
        self._sending.add(  # its digest is known: not hashed again
            asyncio.create_task(self._registry.put_blob(self._repo, data, digest=digest))
        )

    async def _first_done(self) -> None:
        done, _ = await asyncio.wait(self._sending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            self._sending.discard(task)
            task.result()

    async def finish(self) -> None:
        await self.seal_pack()
        while self._sending:
            await self._first_done()

    async def cancel(self) -> None:
        for task in self._sending:
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)


class SnapshotWriter:
    def __init__(
        self,
        keys: UserKeys,
        registry: Registry,
        repo: str,
        *,
        lookup: Lookup,
        record: Recorder,
        previous: SnapshotIndex | None,
        pack_bytes: int,
    ) -> None:
        self._keys = keys
        self._lookup = lookup
        self._previous = previous.chunks_of() if previous is not None else {}
        self._packer = _Packer(registry, repo, record, pack_bytes)
        self._sealed: dict[str, _Slot] = {}  # chunk id -> its slot, for chunks of this snapshot
        self._pending: list[tuple[bytes, _Slot]] = []
        self._pending_bytes = 0

    async def write(self, items: AsyncIterator[FileItem]) -> Written:
        """Consume an export. Raises StoreUnavailable (the store), or what the export raises;
        what it sent is recorded for collection either way."""
        rows: list[tuple[FileEntry, list[ChunkRef]]] = []
        filled: list[tuple[int, list[_Slot]]] = []  # the rows of changed files, placed at the end
        slots: list[_Slot] = []
        entry: FileEntry | None = None
        buffer = bytearray()
        left = read = 0
        try:
            async for item in items:
                if isinstance(item, bytes):
                    if entry is None or len(item) > left:
                        raise StoreUnavailable("the export sent more bytes than its file has")
                    buffer.extend(item)
                    left -= len(item)
                    while len(buffer) >= CHUNK or (left == 0 and buffer):
                        piece = bytes(buffer[:CHUNK])
                        del buffer[:CHUNK]
                        slots.append(await self._place(piece))
                    continue
                if left:
                    raise StoreUnavailable("the export ended a file early")
                entry, buffer = item, bytearray()
                if item.kind == FileKind.FILE and item.changed:
                    left, slots = item.size, []
                    read += item.size
                    # Kept unchanged-marked: the next export hands it back as it is.
                    filled.append((len(rows), slots))
                    rows.append((replace(item, changed=False, name=""), []))
                elif item.kind == FileKind.FILE:  # the previous index's refs, shared as they are
                    rows.append((item, self._previous.get((item.tree, item.path)) or []))
                else:
                    rows.append((item, []))
            if left:
                raise StoreUnavailable("the export ended in the middle of a file")
            await self._flush()
            await self._packer.finish()
        except BaseException:
            await self._packer.cancel()
            raise
        for at, placed_slots in filled:
            rows[at] = (rows[at][0], [slot.ref() for slot in placed_slots])
        index = SnapshotIndex(rows)
        placed = {s.id: f"{s.pack} {s.offset} {s.length}" for s in self._packer.placed}
        return Written(index, self._packer.packs, placed, read)

    async def _place(self, data: bytes) -> _Slot:
        """A slot for one chunk, filled once its place is known (reused, or packed)."""
        chunk_id = self._keys.chunk_id(data)
        known = self._sealed.get(chunk_id)
        if known is not None:
            return known
        slot = _Slot(chunk_id)
        self._sealed[chunk_id] = slot
        self._pending.append((data, slot))
        self._pending_bytes += len(data)
        if len(self._pending) >= LOOKUP_BATCH or self._pending_bytes >= 16 * CHUNK:
            await self._flush()
        return slot

    async def _flush(self) -> None:
        """Look the pending chunks up at once: those the user stored before are referenced
        where they are, the others sealed and packed."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        found = await self._lookup([slot.id for _, slot in pending])
        for (data, slot), where in zip(pending, found, strict=True):
            if where is not None:
                pack, offset, length = where.split(" ")
                slot.pack, slot.offset, slot.length = pack, int(offset), int(length)
            else:
                await self._packer.add(slot, self._keys.seal(slot.id, data))
