"""The fork's placement (files_helper.py `place`: the workspace laid down in a new base's
`lower/` from the export's listing, each file a hard link of its staged copy), run here on a
local directory: what the agent named cannot send anything through a link or outside the
target, even where the directories above the last entry are kept open (`Parents`), which
opens each directory about once; and a directory's time of exactly 0 is kept."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import drivers.files_helper as helper

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
