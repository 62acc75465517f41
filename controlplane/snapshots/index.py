"""A snapshot's index: every entry of its trees (drivers/base.py: FileEntry) and, for files,
where their bytes are (chunks in packs). Stored as one sealed blob per snapshot (JSON, zlib);
a later snapshot of the same sandbox reuses the chunks of the files whose signature did not
change, so it stores about what changed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from drivers.base import FileEntry, FileKind

CHUNK = 1 << 20
"""Files are cut into chunks of 1 MiB (the last one shorter): an edit stores the chunks it
touched; an insertion shifts the rest of its file (no content-defined cutting)."""
FORMAT = 1


@dataclass(frozen=True)
class ChunkRef:
    id: str  # the keyed hash of its plain bytes (sealing.UserKeys.chunk_id)
    pack: str  # the digest of the pack blob holding it sealed
    offset: int
    length: int  # sealed length


@dataclass
class SnapshotIndex:
    entries: list[tuple[FileEntry, list[ChunkRef]]] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes of the files it holds (before dedup, compression and encryption)."""
        return sum(entry.size for entry, _ in self.entries if entry.kind == FileKind.FILE)

    def packs(self) -> list[str]:
        """Every pack its files' chunks are in, each once."""
        return list(dict.fromkeys(ref.pack for _, refs in self.entries for ref in refs))

    def known(self) -> dict[tuple[str, str], tuple[object, ...]]:
        """(tree, path) -> signature: what an export needs to send only what changed."""
        return {(e.tree, e.path): e.signature() for e, _ in self.entries}

    def chunks_of(self) -> dict[tuple[str, str], list[ChunkRef]]:
        return {(e.tree, e.path): refs for e, refs in self.entries}

    def of_trees(self, trees: set[str]) -> Iterator[tuple[FileEntry, list[ChunkRef]]]:
        return ((e, refs) for e, refs in self.entries if e.tree in trees)

    def encode(self) -> bytes:
        packs = self.packs()
        slot = {digest: n for n, digest in enumerate(packs)}
        rows = [
            [
                e.tree,
                e.path,
                e.kind.value,
                e.mode,
                e.uid,
                e.gid,
                e.size,
                e.mtime_ns,
                list(e.stamp),
                e.target,
                e.opaque,
                [[r.id, slot[r.pack], r.offset, r.length] for r in refs],
            ]
            for e, refs in self.entries
        ]
        return json.dumps({"v": FORMAT, "packs": packs, "entries": rows}).encode()

    @classmethod
    def decode(cls, data: bytes) -> SnapshotIndex:
        doc = json.loads(data)
        if doc.get("v") != FORMAT:
            raise ValueError(f"unknown snapshot index format {doc.get('v')!r}")
        packs = doc["packs"]
        entries = []
        for row in doc["entries"]:
            tree, path, kind, mode, uid, gid, size, mtime, stamp, target, opaque, refs = row
            entry = FileEntry(
                tree=tree,
                path=path,
                kind=FileKind(kind),
                mode=mode,
                uid=uid,
                gid=gid,
                size=size,
                mtime_ns=mtime,
                target=target,
                opaque=opaque,
                stamp=tuple(stamp),
                changed=False,
            )
            entries.append((entry, [ChunkRef(r[0], packs[r[1]], r[2], r[3]) for r in refs]))
        return cls(entries)
