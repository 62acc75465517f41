"""Packages from npm kept under the data dir ($ACS_DATA_DIR/build/…), fetched once: a lock so
that parallel runs (xdist workers, several checkouts on one data dir) fetch once, a `.complete`
mark so that a run killed half-way starts again from nothing."""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path


def cached(lock: Path, root: Path, fill: Callable[[Path, str], None]) -> Path:
    """`root`, made by `fill(root, npm)` unless a complete one is there. Raises RuntimeError
    (no npm, or what `fill` raises)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if (root / ".complete").exists():
            return root
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("no `npm` on PATH: install Debian's npm (make browser)")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        fill(root, npm)
        (root / ".complete").touch()
        return root
