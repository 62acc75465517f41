"""The fork's tee (controlplane/snapshots/tee.py): the writer reads the whole export, the base's
build the restored trees with their bytes; a build that stops never holds the writer up, and a
stream left early ends the build with Interrupted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from controlplane.snapshots.tee import Interrupted, Tee
from drivers.base import STATE, SYSTEM, WORKSPACE, FileEntry, FileItem, FileKind


def _file(tree: str, path: str, size: int) -> FileEntry:
    return FileEntry(tree, path, FileKind.FILE, 0o644, size=size)


STREAM: list[FileItem] = [
    FileEntry(WORKSPACE, "", FileKind.DIR, 0o755),
    _file(WORKSPACE, "a", 3),
    b"abc",
    _file(STATE, "secret", 2),
    b"xy",
    _file(SYSTEM, "etc/x", 4),
    b"12",
    b"34",
]


async def _stream(items: list[FileItem], fail: bool = False) -> AsyncIterator[FileItem]:
    for item in items:
        await asyncio.sleep(0)
        yield item
    if fail:
        raise OSError("the export broke")


def _restored(entry: FileEntry) -> bool:
    return entry.tree in (WORKSPACE, SYSTEM)


async def _collect(items: AsyncIterator[FileItem]) -> list[FileItem]:
    return [item async for item in items]


async def test_the_branch_gets_the_restored_trees_with_their_bytes() -> None:
    tee = Tee(_stream(STREAM), _restored, depth=1)
    branch = asyncio.create_task(_collect(tee.branch()))
    main = await _collect(tee.main())
    tee.close()
    assert main == STREAM
    assert await branch == [item for n, item in enumerate(STREAM) if n not in (3, 4)]


async def test_a_branch_that_stops_never_holds_the_writer_up() -> None:
    tee = Tee(_stream(STREAM * 20), _restored, depth=1)
    main = asyncio.create_task(_collect(tee.main()))
    branch = tee.branch()
    first = await anext(branch)
    assert first == STREAM[0]
    await branch.aclose()  # a build that failed, or found the base made already
    assert len(await asyncio.wait_for(main, 10)) == len(STREAM) * 20


async def test_a_stream_left_early_ends_the_branch_with_interrupted() -> None:
    tee = Tee(_stream(STREAM, fail=True), _restored)
    branch = asyncio.create_task(_collect(tee.branch()))
    with pytest.raises(OSError, match="the export broke"):
        await _collect(tee.main())
    with pytest.raises(Interrupted):
        await asyncio.wait_for(branch, 10)


async def test_a_writer_that_stops_reading_ends_the_branch() -> None:
    tee = Tee(_stream(STREAM), _restored)
    branch = asyncio.create_task(_collect(tee.branch()))
    main = tee.main()
    await anext(main)  # the writer fails after its first item and leaves the stream
    tee.close()
    with pytest.raises(Interrupted):
        await asyncio.wait_for(branch, 10)
    await main.aclose()


async def test_the_branch_holds_at_most_its_bytes_and_the_writer_waits_beyond() -> None:
    stream: list[FileItem] = [_file(WORKSPACE, "big", 12), b"abc", b"def", b"ghi", b"jkl"]
    tee = Tee(_stream(stream), _restored, limit=6)
    seen: list[FileItem] = []

    async def write() -> None:
        async for item in tee.main():
            seen.append(item)

    main = asyncio.create_task(write())
    branch = tee.branch()
    await asyncio.sleep(0.1)
    assert seen == stream[:3]  # the entry and 6 bytes held: the next piece waits for room
    assert await _collect(branch) == stream
    await asyncio.wait_for(main, 10)
    assert seen == stream
