"""The fork's placement (drivers/files_helper.py `place`) against the least it must do, on
this host's disk: N staged files laid down in one directory D levels deep, each a hard link of
its copy with its owner, mode and time set. Three runs of each, medians:

- place: the helper's `place` as the fork's export runs it (the directories above the last
  entry kept open: `Parents`);
- reopened: the same entries, each parent opened again from the root one level at a time
  (`parent_fd`, as `place` did before);
- floor: link, open, fstat, fchown, fchmod, utime per file from one directory already open.

Run: `.venv/bin/python -m bench.placement [--files N] [--runs R]` (the helper's functions are
called in this process, on /var/tmp: no engine, no container)."""

from __future__ import annotations

import argparse
import os
import stat
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import drivers.files_helper as helper

UID, GID = os.getuid(), os.getgid()
DEPTHS = (1, 10, 40)


def listing(depth: int, files: int, ready: str) -> list[dict[str, Any]]:
    """The listing of `files` files in a `depth`-deep directory, their copies made in `ready`."""
    entries: list[dict[str, Any]] = [{"p": "", "k": "dir"}]
    entries += [{"p": "/".join(["d"] * n), "k": "dir"} for n in range(1, depth + 1)]
    deep = "/".join(["d"] * depth)
    for i in range(files):
        name = f"{i:09d}"
        with open(os.path.join(ready, name), "wb") as copy:
            copy.write(b"x")
        entries.append({"p": f"{deep}/f{i}", "k": "file", "s": 1, "n": name})
    common = {"t": "workspace", "m": 0o644, "u": UID, "g": GID, "s": 0, "mt": 1_000_000_000}
    return [common | entry for entry in entries]


def reopened(entries: list[dict[str, Any]], ready: str, target: str) -> None:
    """`place` as it was: every parent opened again from the root for each entry."""
    os.mkdir(target, 0o700)
    root_fd = os.open(target, helper.NOFOLLOW_DIR)
    ready_fd = os.open(ready, helper.NOFOLLOW_DIR)
    try:
        for entry in entries[1:]:
            parts = entry["p"].split("/")
            fd = helper.parent_fd(root_fd, parts)
            assert fd is not None
            try:
                if entry["k"] == "dir":
                    os.mkdir(parts[-1], 0o700, dir_fd=fd)
                else:
                    one(fd, ready_fd, entry, parts[-1])
            finally:
                os.close(fd)
    finally:
        os.close(ready_fd)
        os.close(root_fd)


def floor(entries: list[dict[str, Any]], ready: str, target: str) -> None:
    """The directories made first (not timed apart: a few), then each file from one open fd."""
    dirs = [e["p"] for e in entries if e["k"] == "dir" and e["p"]]
    os.makedirs(os.path.join(target, dirs[-1]), 0o700)
    fd = os.open(os.path.join(target, dirs[-1]), helper.NOFOLLOW_DIR)
    ready_fd = os.open(ready, helper.NOFOLLOW_DIR)
    try:
        for entry in entries:
            if entry["k"] == "file":
                one(fd, ready_fd, entry, entry["p"].rsplit("/", 1)[-1])
    finally:
        os.close(ready_fd)
        os.close(fd)


def one(fd: int, ready_fd: int, entry: dict[str, Any], name: str) -> None:
    os.link(entry["n"], name, src_dir_fd=ready_fd, dst_dir_fd=fd, follow_symlinks=False)
    file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    try:
        assert stat.S_ISREG(os.fstat(file_fd).st_mode)
        os.fchown(file_fd, UID, GID)
        os.fchmod(file_fd, 0o644)
        os.utime(file_fd, ns=(1_000_000_000, 1_000_000_000))
    finally:
        os.close(file_fd)


def timed(run: Callable[[list[dict[str, Any]], str, str], object], depth: int, files: int) -> float:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as where:
        ready = os.path.join(where, "ready")
        os.mkdir(ready)
        entries = listing(depth, files, ready)
        started = time.perf_counter()
        run(entries, ready, os.path.join(where, "lower"))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.files} files, {args.runs} runs, load {os.getloadavg()[0]:.1f}")
    print("depth | place s | reopened s | floor s | place/floor | reopened/floor")
    timed(helper.place, 1, args.files)  # warm up: the first run pays for the disk's caches
    for depth in DEPTHS:
        took = {
            name: statistics.median(timed(run, depth, args.files) for _ in range(args.runs))
            for name, run in (("place", helper.place), ("reopened", reopened), ("floor", floor))
        }
        print(
            f"{depth:5d} | {took['place']:7.3f} | {took['reopened']:10.3f} | {took['floor']:7.3f}"
            f" | {took['place'] / took['floor']:11.2f} | {took['reopened'] / took['floor']:14.2f}"
        )


if __name__ == "__main__":
    main()
