"""Running things on the host: commands, daemons in a network namespace and a cgroup of the
cluster's own, waiting with a deadline, mounts."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubecluster.layout import Layout


class ClusterError(RuntimeError):
    """Bring-up, teardown or a command on the cluster failed; the message says where to look."""


def log(message: str) -> None:
    print(f"kube-cluster: {message}", file=sys.stderr, flush=True)


def run(argv: list[str], *, stdin: bytes | None = None, check: bool = True) -> str:
    result = subprocess.run(argv, input=stdin, capture_output=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(
            f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.decode().strip()}"
        )
    return result.stdout.decode()


def in_netns(netns: Path, argv: list[str]) -> list[str]:
    # nsenter, not `ip netns exec`: the latter remounts /sys, hiding the cgroup v1 hierarchies
    # from dockerd ("Devices cgroup isn't mounted") and the kubelet.
    return ["nsenter", f"--net={netns}", "--", *argv]


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones and a v2 'unified')."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0]
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def make_cgroup(path: str) -> list[Path]:
    """Create `path` (and its parents) in every hierarchy; return their cgroup.procs files."""
    procs = []
    for hierarchy in cgroup_hierarchies():
        current = hierarchy
        for part in path.strip("/").split("/"):
            parent, current = current, current / part
            if not current.exists():
                current.mkdir()
                for name in ("cpuset.cpus", "cpuset.mems"):  # empty in a new cpuset cgroup
                    if (parent / name).exists():
                        (current / name).write_text((parent / name).read_text())
        procs.append(current / "cgroup.procs")
    return procs


def spawn(
    layout: Layout,
    name: str,
    argv: list[str],
    *,
    netns: Path,
    cgroup: str,
    env: dict[str, str] | None = None,
) -> int:
    """Start a daemon in `netns`, placed in `cgroup` of every hierarchy before it runs (so that
    its children, such as containerd and its shims, are found there at teardown)."""
    procs = make_cgroup(cgroup)
    logs = layout.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    script = 'for f in $ACS_CGROUP_PROCS; do echo $$ > "$f"; done; exec "$@"'
    with (logs / f"{name}.log").open("ab") as out:
        process = subprocess.Popen(
            ["sh", "-c", script, "sh", *in_netns(netns, argv)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {}), "ACS_CGROUP_PROCS": " ".join(map(str, procs))},
        )
    pids_file = layout.state_dir / "pids.json"
    pids = json.loads(pids_file.read_text()) if pids_file.exists() else {}
    pids[name] = process.pid
    pids_file.write_text(json.dumps(pids, indent=1))
    return process.pid


def log_tail(layout: Layout, name: str, lines: int = 15) -> str:
    path = layout.state_dir / "logs" / f"{name}.log"
    if not path.exists():
        return f"(no log {path})"
    return f"last lines of {path}:\n" + "\n".join(
        path.read_text(errors="replace").splitlines()[-lines:]
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(what: str, check: Any, timeout: float, *, diagnose: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (OSError, ClusterError, http.client.HTTPException, ssl.SSLError) as error:
            last_error, result = error, None
        if result:
            return result
        time.sleep(0.1)
    detail = f" (last error: {last_error})" if last_error else ""
    extra = f"\n{diagnose()}" if diagnose else ""
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{detail}{extra}")


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def mounts_under(*roots: Path) -> list[str]:
    """Mount points at or below `roots`, innermost (latest) first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(root) or point.startswith(f"{root}/") for root in roots):
            found.append(point)
    return list(reversed(found))


def rss_bytes(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf(
                "SC_PAGE_SIZE"
            )
    return total
