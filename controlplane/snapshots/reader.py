"""Reading a snapshot back: its index opened, its packs fetched from the store (a few ahead of
need, each dropped after the last chunk that needs it), every chunk authenticated and checked
against its digest, the files streamed as a runtime imports them (drivers/base.py:
FileSource). A pack's chunks are opened together in a worker thread as soon as it arrives, so
that fetching, opening and the runtime's import of what comes before overlap. Workspace files
the runtime says it holds already (a rewind's, drivers/base.py: FileSource.items) come as
entries alone: their packs are not fetched."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

from controlplane.agent_protocol.kinds import CARRIED_FILES, CONVERSATIONS_DIR, OWNER_MARKS
from controlplane.snapshots.index import ChunkRef, SnapshotIndex
from controlplane.snapshots.registry import Registry
from controlplane.snapshots.sealing import UserKeys
from drivers.base import STATE, SYSTEM, WORKSPACE, FileEntry, FileItem, FileKind

PREFETCH = 4
GAP = 256 * 1024
"""Chunks of a pack less than this apart are read in one ranged request (when only some of a
pack's chunks are needed: a rewind's changed files)."""
RESTORED = frozenset({WORKSPACE, SYSTEM})
"""What a new sandbox gets: not the state tree, whose agent state holds credentials scoped to
the sandbox it was taken of (docs/sandboxes.md#snapshots)."""
REWOUND = frozenset({WORKSPACE, SYSTEM, STATE})
"""What the sandbox a snapshot was taken of gets back when a conversation is rewound to it:
its agent's state too (docs/sandboxes.md#checkpoints)."""


class Fetched:
    """Bytes the restores of this process fetched from the store (the benchmark prints what a
    rewind reads beside the raw copy of the whole snapshot)."""

    total = 0


def state_key(snapshot_id: str) -> str:
    """The identity of a snapshot's content with its state tree (a runtime keeps it apart from
    the plain restore's, which other sandboxes share)."""
    return f"{snapshot_id}-state"


class Carried:
    """Of the state tree, what a conversation's fork carries into its new sandbox: the
    directories down to the conversations', and what the source conversation's directory holds
    under CARRIED_FILES (a file, or a directory with what it holds), moved to the new
    conversation's directory."""

    def __init__(self, source: str, new: str) -> None:
        self._root = CONVERSATIONS_DIR.strip("/")
        self._from = f"{self._root}/{source}"
        self._to = f"{self._root}/{new}"
        self.new = new

    def of(self, entry: FileEntry) -> FileEntry | None:
        """The entry as the fork gets it, or None (not carried)."""
        path = entry.path
        if entry.kind == FileKind.DIR and (path == self._root or self._root.startswith(path + "/")):
            return entry
        if entry.kind == FileKind.DIR and path == self._from:
            return dataclasses.replace(entry, path=self._to)
        name = path.removeprefix(self._from + "/")
        if name != path and name.split("/", 1)[0] in CARRIED_FILES:
            return dataclasses.replace(entry, path=f"{self._to}/{name}")
        return None


class SnapshotSource:
    """A snapshot as a FileSource. `index` loads (and opens) its index when first needed;
    `with_state`: the state tree too (REWOUND rather than RESTORED); else `carried`: of the
    state tree, a conversation's carried history (a fork)."""

    def __init__(
        self,
        snapshot_id: str,
        keys: UserKeys,
        registry: Registry,
        repository: str,
        index: Callable[[], Awaitable[SnapshotIndex]],
        *,
        with_state: bool = False,
        carried: Carried | None = None,
    ) -> None:
        self._id = snapshot_id
        self._trees = REWOUND if with_state else RESTORED
        self._carried = None if with_state else carried
        self._keys = keys
        self._registry = registry
        self._repo = repository
        self._index = index

    @property
    def key(self) -> str:
        if self._carried is not None:  # its own content: the fork's conversation id in it
            return f"{self._id}-fork-{self._carried.new}"
        return state_key(self._id) if self._trees is REWOUND else self._id

    def _rows(self, index: SnapshotIndex) -> list[tuple[FileEntry, list[ChunkRef]]]:
        rows: list[tuple[FileEntry, list[ChunkRef]]] = []
        for entry, refs in index.of_trees(REWOUND):
            kept: FileEntry | None = entry
            if entry.tree != STATE:
                kept = entry if entry.tree in self._trees else None
            elif self._trees is REWOUND:
                kept = None if _owner_mark(entry) else entry
            else:
                kept = self._carried.of(entry) if self._carried is not None else None
            if kept is not None:
                rows.append((kept, refs))
        return rows

    async def workspace(self) -> list[FileEntry]:
        """The workspace tree's entries (their signatures as taken), nothing fetched but the
        index."""
        return [entry for entry, _ in self._rows(await self._index()) if entry.tree == WORKSPACE]

    async def items(self, held: Collection[str] = ()) -> AsyncIterator[FileItem]:
        index = await self._index()
        rows = self._rows(index)
        have = frozenset(held)

        def fetched(entry: FileEntry) -> bool:
            return entry.kind == FileKind.FILE and not (
                entry.tree == WORKSPACE and entry.path in have
            )

        used = [ref for entry, refs in rows for ref in refs if fetched(entry)]
        last_use = {ref.pack: n for n, ref in enumerate(used)}
        wanted: dict[str, set[ChunkRef]] = {}
        for ref in used:
            wanted.setdefault(ref.pack, set()).add(ref)
        order = list(wanted)
        fetches: dict[str, asyncio.Task[dict[ChunkRef, bytes]]] = {}
        ahead = 0
        where = f"snapshot {self._id}"

        async def load(digest: str) -> dict[ChunkRef, bytes]:
            return await self._load(digest, wanted[digest], where, partial=bool(have))

        def prefetch() -> None:
            nonlocal ahead
            while ahead < len(order) and len(fetches) < PREFETCH:
                digest = order[ahead]
                fetches[digest] = asyncio.create_task(load(digest))
                ahead += 1

        opened: dict[str, dict[ChunkRef, bytes]] = {}
        position = 0
        try:
            for entry, refs in rows:
                yield entry
                if not fetched(entry):
                    continue
                for ref in refs:
                    pack = opened.get(ref.pack)
                    if pack is None:
                        prefetch()
                        pack = await fetches.pop(ref.pack)
                        opened[ref.pack] = pack
                        prefetch()
                    yield pack[ref]
                    if last_use[ref.pack] == position:
                        del opened[ref.pack]
                    position += 1
        finally:
            for task in fetches.values():
                task.cancel()
            await asyncio.gather(*fetches.values(), return_exceptions=True)

    async def _load(
        self, digest: str, refs: set[ChunkRef], where: str, *, partial: bool
    ) -> dict[ChunkRef, bytes]:
        """The chunks `refs` of pack `digest`, opened; `partial`: only their bytes are read
        (a rewind's few changed files), else the whole pack, its digest checked."""
        if partial:
            parts = await self._parts(digest, refs)
            return await asyncio.to_thread(self._open_parts, parts, where)
        sealed = await self._registry.get_blob(self._repo, digest)
        Fetched.total += len(sealed)
        return await asyncio.to_thread(self._open_pack, sealed, refs, where)

    async def _parts(self, digest: str, refs: set[ChunkRef]) -> list[tuple[ChunkRef, bytes]]:
        """The sealed bytes of `refs` out of pack `digest`, by ranged reads (neighbours within
        GAP read together); each is authenticated and hashed when opened (the pack's own digest
        covers only the whole pack)."""
        spans: list[list[ChunkRef]] = []
        for ref in sorted(refs, key=lambda r: r.offset):
            last = spans[-1][-1] if spans else None
            if last is not None and ref.offset - (last.offset + last.length) <= GAP:
                spans[-1].append(ref)
            else:
                spans.append([ref])
        parts: list[tuple[ChunkRef, bytes]] = []
        for span in spans:
            start = span[0].offset
            end = max(ref.offset + ref.length for ref in span)
            data = await self._registry.get_blob_range(self._repo, digest, start, end)
            Fetched.total += len(data)
            view = memoryview(data)
            parts += [
                (r, bytes(view[r.offset - start : r.offset - start + r.length])) for r in span
            ]
        return parts

    def _open_parts(self, parts: list[tuple[ChunkRef, bytes]], where: str) -> dict[ChunkRef, bytes]:
        """Blocking."""
        return {ref: self._keys.open(ref.id, sealed, where) for ref, sealed in parts}

    def _open_pack(self, sealed: bytes, refs: set[ChunkRef], where: str) -> dict[ChunkRef, bytes]:
        """The chunks of one pack that the files need (each once), authenticated and checked
        against their digests (SnapshotDamaged otherwise). Blocking."""
        view = memoryview(sealed)
        return {
            ref: self._keys.open(ref.id, bytes(view[ref.offset : ref.offset + ref.length]), where)
            for ref in refs
        }


def _owner_mark(entry: FileEntry) -> bool:
    return entry.tree == STATE and entry.path.rsplit("/", 1)[-1] in OWNER_MARKS
