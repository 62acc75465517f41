"""One export's stream read by two: the snapshot's writer (`main`, which drives it) and, for a
fork on a runtime that keeps a shared copy of a snapshot's files (Docker's base), that copy's
build (`branch`, given only the entries `keep` takes, with their bytes). The branch holds at
most `depth` items and `limit` bytes (one item more when that one alone is larger): the writer
waits for a build that lags, so the two go at the pace of the slower, side by side, and nothing
is held whole; the bytes held ride out either side's hiccups (an archive batch the export
reads, a piece the engine's extraction takes its time over) without stalling the other. A
branch that stops taking (its build failed, or found the copy made already) never holds the
writer up; a stream that ends early (the export or the writer failed) ends the branch with
`Interrupted`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from drivers.base import FileEntry, FileItem

DEPTH = 4096
LIMIT = 16 << 20


class Interrupted(Exception):
    """The export's stream ended before its end: what the branch got is not a snapshot."""


class Tee:
    def __init__(
        self,
        items: AsyncIterator[FileItem],
        keep: Callable[[FileEntry], bool],
        depth: int = DEPTH,
        limit: int = LIMIT,
    ) -> None:
        self._items = items
        self._keep = keep
        self._depth = depth
        self._limit = limit
        self._held = 0  # bytes pending
        self._pending: deque[FileItem] = deque()
        self._ended = False
        self._error: Exception | None = None
        self._stopped = False  # the branch takes nothing more
        self._room = asyncio.Event()
        self._ready = asyncio.Event()
        # Where the time went (the fork's timing event): seconds `main` waited for the
        # export's next item, and for a branch that lagged.
        self.stream_waited = 0.0
        self.main_waited = 0.0

    async def main(self) -> AsyncGenerator[FileItem]:
        """Every item, as the export streams it (the writer's)."""
        kept = False
        finished = False
        try:
            while True:
                began = time.monotonic()
                try:
                    item = await anext(self._items)
                except StopAsyncIteration:
                    break
                self.stream_waited += time.monotonic() - began
                if not isinstance(item, bytes):
                    kept = self._keep(item)
                if kept:
                    await self._put(item)
                yield item
            finished = True
        finally:
            self._ended = True
            if not finished:
                self._error = Interrupted("the export's stream ended early")
            self._ready.set()

    def close(self) -> None:
        """The writer is done with the stream (whatever happened): a branch still reading
        ends, with Interrupted unless the stream reached its end."""
        if not self._ended:
            self._ended = True
            self._error = Interrupted("the export's stream was left before its end")
        self._ready.set()

    async def branch(self) -> AsyncGenerator[FileItem]:
        """The kept entries and their bytes (the copy's build); raises Interrupted when the
        stream did not reach its end."""
        try:
            while True:
                while not self._pending:
                    if self._ended:
                        if self._error is not None:
                            raise self._error
                        return
                    self._ready.clear()
                    await self._ready.wait()
                item = self._pending.popleft()
                self._held -= _size(item)
                self._room.set()
                yield item
        finally:
            self._stopped = True
            self._pending.clear()
            self._held = 0
            self._room.set()

    async def _put(self, item: FileItem) -> None:
        while self._full(_size(item)) and not self._stopped:
            self._room.clear()
            began = time.monotonic()
            await self._room.wait()
            self.main_waited += time.monotonic() - began
        if not self._stopped:
            self._pending.append(item)
            self._held += _size(item)
            self._ready.set()

    def _full(self, size: int) -> bool:
        """No room for an item of `size` bytes (an empty branch always takes one)."""
        if not self._pending:
            return False
        return len(self._pending) >= self._depth or self._held + size > self._limit


def _size(item: FileItem) -> int:
    return len(item) if isinstance(item, bytes) else 0
