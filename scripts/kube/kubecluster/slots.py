"""Which slot a cluster uses, and who owns it (a test session, or the command line)."""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path

from kubecluster.host import ClusterError, alive, write_json
from kubecluster.layout import GLOBAL_LOCK, SLOTS, Layout


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_alive(layout: Layout) -> bool:
    """A slot is in use while the process that brought it up (a test session) lives, or, for a
    cluster started from the command line, while its API server does."""
    try:
        owner = json.loads(layout.owner_file.read_text())
    except (OSError, ValueError):
        return False
    pid = owner.get("pid")
    if pid is None:
        pids_file = layout.state_dir / "pids.json"
        with contextlib.suppress(OSError, ValueError, KeyError):
            return alive(int(json.loads(pids_file.read_text())["kube-apiserver"]))
        return False
    start = process_start(pid)
    return start is not None and start == owner.get("start")


def claim_slot(owner_pid: int | None, slot: int | None = None) -> int:
    """The slot to use: `slot`, else the first one nobody alive uses. Records the owner."""
    with locked(GLOBAL_LOCK):
        candidates = [slot] if slot is not None else list(range(SLOTS))
        for candidate in candidates:
            layout = Layout(candidate)
            if slot is None and owner_alive(layout):
                continue
            if slot is not None and owner_alive(layout):
                owner = json.loads(layout.owner_file.read_text())
                if owner.get("pid") not in (None, owner_pid):
                    raise ClusterError(
                        f"slot {slot} is in use by process {owner['pid']} (a test session); "
                        "choose another with --slot"
                    )
            layout.state_dir.mkdir(parents=True, exist_ok=True)
            write_json(
                layout.owner_file,
                {"pid": owner_pid, "start": process_start(owner_pid) if owner_pid else None},
            )
            return candidate
    raise ClusterError(f"all {SLOTS} cluster slots are in use")
