"""A stream of files (drivers/base.py: FileItem) as a tar archive the engine extracts itself
(PUT /containers/{id}/archive): owners, modes and times from the headers, whiteouts as the
character devices 0/0 overlay takes them for, a directory's overlay opacity as an extended
attribute, paths under a root of the target container. The engine's own extraction is much
faster than any stream into a container's process (a helper's stdin)."""

from __future__ import annotations

import asyncio
import queue
import tarfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from drivers.base import FileEntry, FileItem, FileKind

BLOCK = 512
CHUNK = 1 << 20


def header(entry: FileEntry, name: str) -> bytes:
    """The PAX header of one entry, named `name` in the archive."""
    info = tarfile.TarInfo(name)
    info.mode = entry.mode
    info.uid, info.gid = entry.uid, entry.gid
    seconds, ns = divmod(entry.mtime_ns, 1_000_000_000)
    info.mtime = seconds
    pax = {"mtime": f"{seconds}.{ns:09d}"}
    if entry.kind == FileKind.FILE:
        info.type, info.size = tarfile.REGTYPE, entry.size
    elif entry.kind == FileKind.DIR:
        info.type = tarfile.DIRTYPE
        if entry.opaque:
            pax["SCHILY.xattr.trusted.overlay.opaque"] = "y"
    elif entry.kind == FileKind.SYMLINK:
        info.type, info.linkname = tarfile.SYMTYPE, entry.target
    else:  # DELETED: an overlay whiteout
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 0, 0
    info.pax_headers = pax
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


async def archive(
    items: AsyncIterator[FileItem], name_of: Callable[[FileEntry], str | None]
) -> AsyncIterator[bytes]:
    """The tar archive of `items`, in pieces of about CHUNK bytes; an entry whose name_of is
    None is left out (with its bytes)."""
    buffer = bytearray()
    keep = True
    padding = 0
    async for item in items:
        if isinstance(item, bytes):
            if keep and len(item) >= CHUNK:  # a large piece as it is: not copied once more
                if buffer:
                    yield bytes(buffer)
                    buffer.clear()
                yield item
            elif keep:
                buffer += item
        else:
            buffer += b"\0" * padding
            padding = 0
            name = name_of(item)
            keep = name is not None
            if name is not None:
                buffer += header(item, name)
                if item.kind == FileKind.FILE:
                    padding = -item.size % BLOCK
        if len(buffer) >= CHUNK:
            yield bytes(buffer)
            buffer.clear()
    buffer += b"\0" * padding + b"\0" * (2 * BLOCK)
    yield bytes(buffer)


class Feed:
    """Hands pieces made on the event loop to a blocking consumer (the engine client's upload
    in a thread) through a small bounded queue; `fail` makes the consumer stop with an error."""

    def __init__(self, depth: int = 8) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=depth)
        self.stopped = threading.Event()

    def pieces(self) -> Iterator[bytes]:
        """The consumer's side (blocking)."""
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stopped.set()

    async def put(self, item: bytes | BaseException | None) -> None:
        """Hand over one piece (None: the end), waiting while the consumer is behind; a
        consumer that stopped takes nothing more."""
        while not self.stopped.is_set():
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                await asyncio.sleep(0.002)
