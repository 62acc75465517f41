"""Bounds of the snapshot helper and of the restore stream that a hostile workspace must not
break (security review of the Kubernetes snapshots): a file the agent grows after it was
listed is copied only up to its listed size (the size limit was checked against that, and the
helper's scratch space is on a shared node); a file swapped for a link while it is copied is
left out instead of ending the helper; and a large file goes to the loader in pieces, never
whole in the control plane's memory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import drivers.files_helper as helper
from drivers.base import WORKSPACE, FileEntry, FileItem, FileKind
from drivers.kubernetes.exec import PIECE
from drivers.kubernetes.files import send_items


def listed(root: Path, path: str) -> dict[str, Any]:
    """The entry the helper's own scan makes of `root/path` now."""
    st = os.lstat(root / path)
    entry = helper.entry_of("w", path, st, None, str(root / path), layer=False)
    assert entry is not None
    entry["src"] = "ws"
    return entry


@pytest.fixture
def helper_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.setitem(helper.ROOTS, "ws", str(root))
    monkeypatch.setattr(helper, "STAGING", [str(tmp_path / "staging")])
    (tmp_path / "staging").mkdir()
    return root


def test_a_file_grown_after_its_listing_is_copied_only_up_to_its_listed_size(
    helper_roots: Path,
) -> None:
    (helper_roots / "grows").write_bytes(b"x" * 1000)
    entry = listed(helper_roots, "grows")
    with (helper_roots / "grows").open("ab") as grown:  # the agent, after the scan
        grown.truncate(1 << 30)  # a sparse GiB: would be written out whole without the bound
    staged: helper.Staged = {}
    copied = helper.stage([entry], {}, staged)
    assert copied == 1000
    _, copy, clean = staged[("w", "grows")]
    assert os.path.getsize(copy) == 1000
    assert not clean  # copied again, listed anew, while the sandbox is held still


def test_a_file_swapped_for_a_link_while_staged_is_left_out(helper_roots: Path) -> None:
    (helper_roots / "secret").write_text("mine")
    (helper_roots / "plain").write_text("kept")
    entries = [listed(helper_roots, "secret"), listed(helper_roots, "plain")]
    (helper_roots / "secret").unlink()
    (helper_roots / "secret").symlink_to("/etc/shadow")  # O_NOFOLLOW: ELOOP, not a crash
    staged: helper.Staged = {}
    helper.stage(entries, {}, staged)
    assert ("w", "secret") not in staged
    assert "secret" in helper.SKIPPED
    assert Path(staged[("w", "plain")][1]).read_text() == "kept"


async def test_a_large_file_is_sent_in_pieces(tmp_path: Path) -> None:
    size = 40 * PIECE

    async def items() -> AsyncIterator[FileItem]:
        yield FileEntry(WORKSPACE, "", FileKind.DIR, 0o755)
        yield FileEntry(WORKSPACE, "big", FileKind.FILE, 0o644, size=size)
        for _ in range(size // PIECE):
            yield b"\0" * PIECE

    writes: list[int] = []

    async def write(data: bytes) -> None:
        writes.append(len(data))

    assert await send_items(write, items()) == 2
    assert sum(writes) > size
    assert max(writes) <= 2 * PIECE + 64  # a piece and its frame, plus what preceded it


def nest(root: Path, levels: int) -> None:
    """`levels` directories, each in the last (relative steps: past PATH_MAX, as a shell's
    `mkdir d; cd d` loop makes them)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def test_a_tree_as_deep_as_the_limit_is_walked_whole(helper_roots: Path) -> None:
    nest(helper_roots, helper.MAX_DEPTH)
    found = helper.walk("ws", lambda _path: "workspace", set())
    deepest = max(len(entry["p"].split("/")) for entry in found)
    assert deepest == helper.MAX_DEPTH


def test_a_tree_nested_thousands_deep_is_refused_not_a_crash(helper_roots: Path) -> None:
    try:
        nest(helper_roots, 5000)  # deeper than Python's recursion limit and PATH_MAX
        with pytest.raises(helper.TooDeep) as refused:
            helper.walk("ws", lambda _path: "workspace", set())
    finally:
        # pytest's own clean-up of old temporary directories (shutil.rmtree) would meet the
        # same recursion limit, in every later session: removed here, by a tool that can.
        subprocess.run(["rm", "-rf", str(helper_roots / "d")], check=True)
    tree, path = refused.value.args
    assert tree == "workspace"
    assert len(path.split("/")) == helper.MAX_DEPTH + 1


def test_the_second_look_stages_no_more_than_its_own_changed_files(helper_roots: Path) -> None:
    """A file staged by the first look and deleted before the second leaves no copy behind:
    the scratch limit, checked against the second look's changed files, bounds the staging."""
    (helper_roots / "first").write_bytes(b"x" * 10_000)
    staged: helper.Staged = {}
    helper.stage([listed(helper_roots, "first")], {}, staged)
    copy = staged[("w", "first")][1]
    assert os.path.getsize(copy) == 10_000
    (helper_roots / "first").unlink()  # the agent, between the two looks
    (helper_roots / "second").write_bytes(b"y" * 5_000)
    second = [listed(helper_roots, "second")]
    assert helper.staging_bytes(second, {}) == 8192  # whole blocks, as the volume counts them
    helper.prune(second, {}, staged)
    helper.stage(second, {}, staged)
    assert not os.path.exists(copy)
    assert list(staged) == [("w", "second")]
