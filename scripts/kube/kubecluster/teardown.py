"""Removing everything a cluster slot made, running or left over from a killed run."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from kubecluster.host import ClusterError, cgroup_hierarchies, mounts_under, run
from kubecluster.layout import MAX_NODES, POD_LOG_DIRS, SHIM_SOCKET_DIR, SLOTS, Layout


def cgroup_dirs(layout: Layout) -> list[Path]:
    """Every cgroup directory of the slot's subtree, in every hierarchy, deepest first."""
    found: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / layout.cgroup.strip("/")
        if root.is_dir():
            found += [Path(dirpath) for dirpath, _, _ in os.walk(root)]
    return sorted(found, key=lambda path: len(path.parts), reverse=True)


def cgroup_pids(layout: Layout) -> set[int]:
    pids: set[int] = set()
    for directory in cgroup_dirs(layout):
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
    return pids


def freezer(layout: Layout) -> Path | None:
    for hierarchy in cgroup_hierarchies():
        state = hierarchy / layout.cgroup.strip("/") / "freezer.state"
        if state.exists():
            return state
    return None


def kill_all(layout: Layout) -> int:
    """SIGKILL every process of the slot's cgroup subtree (daemons, containerd shims, pods);
    frozen first, so that nothing forks or restarts a container in between. Returns how many."""
    killed: set[int] = set()
    frozen = freezer(layout)
    deadline = time.monotonic() + 30
    while pids := cgroup_pids(layout):
        if time.monotonic() > deadline:
            raise ClusterError(f"processes of {layout.cgroup} survive SIGKILL: {sorted(pids)}")
        if frozen:
            with contextlib.suppress(OSError):
                frozen.write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        if frozen:
            with contextlib.suppress(OSError):
                frozen.write_text("THAWED")
        time.sleep(0.05)
    wait_reaped(killed)
    return len(killed)


def wait_reaped(pids: set[int], within: float = 10) -> None:
    """Wait until the killed processes are reaped (their parent, often init once the daemons
    are gone, collects them): until then /proc still shows them, as zombies."""
    deadline = time.monotonic() + within
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
        if pids:
            time.sleep(0.05)


def shim_sockets(layout: Layout) -> set[Path]:
    """The sockets the nodes' containerd shims made under the fixed /run/containerd/s: named by
    the sha256 of "<containerd address>/<namespace>/<container id>" (containerd's
    runtime/v2/shim SocketAddress). Found from the live shims' command lines and from the
    containers the nodes' data roots still list (shims already gone)."""
    keys: set[str] = set()
    for pid in cgroup_pids(layout):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if argv and argv[0].endswith("containerd-shim-runc-v2"):
                flags = dict(zip(argv[1::2], argv[2::2], strict=False))
                keys.add(f"{flags['-address']}/{flags['-namespace']}/{flags['-id']}")
    for index in range(1, MAX_NODES + 1):
        containers = layout.docker_root(index) / "containers"
        if containers.is_dir():
            address = layout.node_dir(index) / "dexec" / "containerd" / "containerd.sock"
            keys |= {f"{address}/moby/{entry.name}" for entry in containers.iterdir()}
    return {SHIM_SOCKET_DIR / hashlib.sha256(key.encode()).hexdigest() for key in keys}


def unmount_all(layout: Layout) -> int:
    count = 0
    for _ in range(5):  # a lazily detached parent can reveal nothing new, but be sure
        points = mounts_under(layout.state_dir)
        if not points:
            break
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            count += 1
    return count


def pod_uids(layout: Layout) -> set[str]:
    uids: set[str] = set()
    for node in layout.state_dir.glob("n*/kubelet/pods"):
        uids |= {entry.name for entry in node.iterdir()}
    return uids


def remove_pod_logs(layout: Layout) -> None:
    """The kubelet writes pod log links under the fixed /var/log/pods and /var/log/containers;
    remove the entries of this cluster's pods, and the directories if nothing else is left in
    them and no other slot is up."""
    pods_dir, containers_dir = POD_LOG_DIRS
    uids = pod_uids(layout)
    if pods_dir.is_dir():
        for entry in pods_dir.iterdir():
            if entry.name.rsplit("_", 1)[-1] in uids:
                shutil.rmtree(entry, ignore_errors=True)
    if containers_dir.is_dir():
        for link in containers_dir.iterdir():
            target = os.readlink(link) if link.is_symlink() else ""
            if target.startswith(f"{pods_dir}/") and not Path(target).exists():
                link.unlink()
    others_up = any(Layout(slot).state_dir.exists() for slot in range(SLOTS) if slot != layout.slot)
    if not others_up:
        for directory in (containers_dir, pods_dir):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty


def teardown(layout: Layout) -> dict[str, float | int]:
    """Remove everything the slot's cluster made, whether it is running, half up, or the
    leftovers of a killed run. Safe when there is nothing."""
    started = time.monotonic()
    sockets = shim_sockets(layout)
    killed = kill_all(layout)
    for socket in sockets:
        socket.unlink(missing_ok=True)
    # Network namespaces go with their last process and bind mount; the host's veth end with
    # the control namespace, the host routes with the veth.
    unmounted = unmount_all(layout)
    with contextlib.suppress(ClusterError):
        if Path(f"/sys/class/net/{layout.host_veth}").exists():
            run(["ip", "link", "del", layout.host_veth])
    for directory in cgroup_dirs(layout):
        for _ in range(50):
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)  # a killed process may take a moment to leave its cgroup
    if layout.state_dir.exists():
        remove_pod_logs(layout)
    shutil.rmtree(layout.state_dir, ignore_errors=True)
    leftovers = [str(d) for d in cgroup_dirs(layout)] + mounts_under(layout.state_dir)
    if layout.state_dir.exists() or leftovers:
        raise ClusterError(f"teardown of slot {layout.slot} left {leftovers or [layout.state_dir]}")
    return {
        "seconds": round(time.monotonic() - started, 2),
        "killed": killed,
        "unmounted": unmounted,
    }
