"""A snapshot's index: every entry of its trees (drivers/base.py: FileEntry) and, for files,
where their bytes are (chunks in packs). Stored as one sealed blob per snapshot (JSON, zlib);
a later snapshot of the same sandbox reuses the chunks of the files whose signature did not
change, so it stores about what changed."""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from operator import attrgetter

from drivers.base import FileEntry, FileKind

CHUNK = 1 << 20
"""Files are cut into chunks of 1 MiB (the last one shorter): an edit stores the chunks it
touched; an insertion shifts the rest of its file (no content-defined cutting)."""
FORMAT = 1
_ROW = attrgetter(
    "tree", "path", "kind", "mode", "uid", "gid", "size", "mtime_ns", "stamp", "target", "opaque"
)


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

    def known(self) -> dict[tuple[str, str], FileEntry]:
        """(tree, path) -> entry: what an export needs to send only what changed (an
        unchanged entry comes back as the same object)."""
        return {(e.tree, e.path): e for e, _ in self.entries}

    def chunks_of(self) -> dict[tuple[str, str], list[ChunkRef]]:
        return {(e.tree, e.path): refs for e, refs in self.entries}

    def of_trees(self, trees: Container[str]) -> Iterator[tuple[FileEntry, list[ChunkRef]]]:
        return ((e, refs) for e, refs in self.entries if e.tree in trees)

    def encode(self) -> bytes:
        packs = self.packs()
        slot = {digest: n for n, digest in enumerate(packs)}
        # One C call per entry for its fields (kind a str, stamp a tuple: JSON as they are);
        # a checkpoint writes its whole index every time, 10,000 rows and more.
        rows = [
            [*_ROW(e), [[r.id, slot[r.pack], r.offset, r.length] for r in refs]]
            for e, refs in self.entries
        ]
        doc = {"v": FORMAT, "packs": packs, "entries": rows}
        return json.dumps(doc, separators=(",", ":")).encode()

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
