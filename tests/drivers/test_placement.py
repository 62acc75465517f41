"""The fork's placement (files_helper.py `place`: the workspace laid down in a new base's
`lower/` from the export's listing, each file a hard link of its staged copy), run here on a
local directory: what the agent named cannot send anything through a link or outside the
target, even where the directories above the last entry are kept open (`Parents`); a
directory's time of exactly 0 is kept; and the paths it could not lay down are named, bounded
in number and length (the control plane logs them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import drivers.files_helper as helper
from drivers.docker.bases import _placed
from drivers.docker.files import Staging
from drivers.errors import DriverError

UID, GID = os.getuid(), os.getgid()


def entry(path: str, kind: str, **more: Any) -> dict[str, Any]:
    made = {"t": "workspace", "p": path, "k": kind, "m": 0o755, "u": UID, "g": GID, "s": 0}
    return made | {"mt": 1_000_000_123} | more


class Ready:
    """The export's ready directory: staged copies named by number."""

    def __init__(self, where: Path) -> None:
        self.where = where
        where.mkdir()
        self.count = 0

    def file(self, path: str, data: bytes = b"x") -> dict[str, Any]:
        self.count += 1
        name = f"{self.count:09d}"
        (self.where / name).write_bytes(data)
        return entry(path, "file", m=0o644, s=len(data), n=name)


def test_a_link_never_leads_a_placement_out_even_beside_kept_parents(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ready = Ready(tmp_path / "ready")
    entries = [
        entry("", "dir"),
        entry("d", "dir"),
        ready.file("d/x"),
        entry("d/sub", "dir"),
        ready.file("d/sub/y"),
        entry("dlink", "symlink", l=str(outside)),  # beside the kept d/
        ready.file("dlink/z"),  # through the link: never
        ready.file("d/w"),  # back up to a kept parent
        entry("d/sub/up", "symlink", l="../.."),
        ready.file("d/sub/up/d/v"),
        ready.file("../escape"),
        ready.file("d/x/under-a-file"),
    ]
    answer = helper.place(entries, str(ready.where), str(tmp_path / "lower"))
    assert answer["missed"] == 4, answer
    assert sorted(answer["skipped"]) == sorted(
        ["dlink/z", "d/sub/up/d/v", "../escape", "d/x/under-a-file"]
    )
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape").exists()
    lower = tmp_path / "lower"
    assert sorted(str(p.relative_to(lower)) for p in lower.rglob("*")) == [
        "d",
        "d/sub",
        "d/sub/up",
        "d/sub/y",
        "d/w",
        "d/x",
        "dlink",
    ]


def test_a_directory_dated_zero_keeps_its_time(tmp_path: Path) -> None:
    ready = Ready(tmp_path / "ready")
    entries = [entry("", "dir"), entry("epoch", "dir", mt=0), ready.file("epoch/f")]
    helper.place(entries, str(ready.where), str(tmp_path / "lower"))
    assert os.stat(tmp_path / "lower" / "epoch").st_mtime_ns == 0
    assert os.stat(tmp_path / "lower").st_mtime_ns == 1_000_000_123


def test_a_deep_directorys_entries_open_it_once(tmp_path: Path) -> None:
    ready = Ready(tmp_path / "ready")
    depth, files = 40, 500
    deep = "/".join(["level"] * depth)
    entries = [entry("", "dir")]
    entries += [entry("/".join(["level"] * n), "dir") for n in range(1, depth + 1)]
    entries += [ready.file(f"{deep}/f{i}") for i in range(files)]
    answer = helper.place(entries, str(ready.where), str(tmp_path / "lower"))
    assert answer["placed"] == len(entries)
    # Once to make the entries in each directory, once to set its mode and time (opening
    # every level again for each entry: depth * files, 20,000).
    assert answer["opened"] == 2 * depth


def test_the_paths_it_could_not_lay_down_are_named_briefly(tmp_path: Path) -> None:
    """A hostile workspace's long names (a name is up to 255 bytes, a path 4,095 and more)
    would otherwise go whole into the answer and the control plane's log."""
    ready = Ready(tmp_path / "ready")
    long = "/".join(["n" * 250] * 16)
    entries = [entry("", "dir")] + [ready.file(f"missing/{long}{i}") for i in range(50)]
    answer = helper.place(entries, str(ready.where), str(tmp_path / "lower"))
    assert answer["missed"] == 50
    assert len(answer["skipped"]) == helper.SHOWN
    for path in answer["skipped"]:
        assert len(path) == helper.SHOWN_LENGTH + 3
        assert path.startswith("missing/nnn")
        assert path.endswith("...")
    assert helper.shown_all(["short"]) == ["short"]


async def test_a_failed_placements_error_names_the_paths_briefly() -> None:
    """The control plane bounds them too, whatever the helper's answer holds (it is read from
    a container that mounts the agent's files): the error is logged."""
    staging = Staging("base")
    long = [f"{'n' * 4000}{i}" for i in range(50)]
    staging.tell({"placed": 1, "bytes": 0, "missed": 50, "skipped": long, "cleaned": 0})
    with pytest.raises(DriverError) as failed:
        _placed(staging, 51)
    message = str(failed.value)
    assert "1 of 51 entries, 50 missed" in message
    assert message.count("'n") == 20
    assert len(message) < 20 * 130 + 200
