"""The program the Docker driver runs in a short-lived helper container to read or write a
sandbox's files (drivers/docker_files.py). It is sent as `python3 -I -S -c <this file>` and
must run on any Python 3.9+ with the standard library alone, since it runs in the helper image
(ACS_SNAPSHOT_HELPER_IMAGE), not in the control plane.

Mounts: /acs/ws (the workspace volume) and /acs/upper (the container's own writable layer, the
overlay "upper" directory: what changed outside the workspace, with whiteouts for what was
deleted from the image). Nothing is ever followed through a symbolic link: every path is walked
from a directory descriptor with O_NOFOLLOW, so a tree the agent shaped cannot send a read or a
write elsewhere.

Messages both ways are frames: one type byte, a 4-byte big-endian length, the payload.
J: a JSON object; E: one entry (JSON); B: bytes of the file the last E announced; Z: the end.

export: {"op": "export", "known": {tree: {path: signature}}, "state": [dirs], "skip": [dirs],
"precopy": bool}. Scans the trees and, with `precopy`, copies what changed since `known` to a
staging directory while the sandbox still runs, then says {"ready": ...}. The control plane
holds the sandbox still and answers {"op": "go"}: the trees are scanned again and only what
changed meanwhile is copied, then {"done": ...}; the control plane lets the sandbox go on, and
the listing follows (E frames, each changed file's bytes in B frames from the staged copy).
import: {"op": "import", "roots": {tree: dir}}, then E/B frames and Z: the entries written with
their owners, modes and times (directories' times last); answers {"done": ...}.
forkdirs: {"op": "forkdirs", "base": dir, "ids": [...]}: an empty upper and work directory per
id under <base>/forks/<id>, the upper one with the owner and mode of <base>/lower.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
from collections.abc import Callable
from typing import Any

Entry = dict[str, Any]
Staged = dict[tuple[str, str], tuple[list[Any], str, bool]]

PIECE = 1 << 20
OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
STAGING = "/acs/staging"
ROOTS = {"ws": "/acs/ws", "upper": "/acs/upper", "base": "/acs/base"}
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
SYSTEM_SKIP = {".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf", "proc", "sys", "dev"}

inp = sys.stdin.buffer
out = sys.stdout.buffer


def send(kind: bytes, payload: bytes) -> None:
    out.write(kind + struct.pack(">I", len(payload)) + payload)


def send_json(kind: bytes, obj: dict[str, Any]) -> None:
    send(kind, json.dumps(obj).encode())


def read_frame() -> tuple[bytes, bytes]:
    head = inp.read(5)
    if len(head) < 5:
        raise SystemExit("input ended early")
    size = struct.unpack(">I", head[1:])[0]
    payload = inp.read(size)
    if len(payload) < size:
        raise SystemExit("input ended early")
    return head[:1], payload


def opaque(path: str) -> bool:
    for attr in OPAQUE:
        try:
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
        except OSError:
            pass
    return False


def entry_of(
    tree: str, path: str, st: os.stat_result, parent_fd: int | None, name: str
) -> Entry | None:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        kind = "file"
    elif stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISLNK(mode):
        kind = "symlink"
    elif stat.S_ISCHR(mode) and st.st_rdev == 0:
        kind = "deleted"  # an overlay whiteout: removed from the image
    else:
        return None  # sockets, fifos, devices: not kept
    entry = {
        "t": tree,
        "p": path,
        "k": kind,
        "m": stat.S_IMODE(mode),
        "u": st.st_uid,
        "g": st.st_gid,
        "s": st.st_size if kind == "file" else 0,
        "mt": st.st_mtime_ns,
        "ct": st.st_ctime_ns,
        "i": st.st_ino,
    }
    if kind == "symlink":
        entry["l"] = os.readlink(name, dir_fd=parent_fd)
    if kind == "dir" and parent_fd is not None:
        entry["o"] = opaque(f"/proc/self/fd/{parent_fd}/{name}")
    return entry


def signature(entry: Entry) -> list[Any]:
    return [
        entry["k"],
        entry["m"],
        entry["u"],
        entry["g"],
        entry["s"],
        entry["mt"],
        entry["ct"],
        entry["i"],
        entry.get("l", ""),
        entry.get("o", False),
    ]


def walk(src: str, tree_of: Callable[[str], str | None], skip: set[str]) -> list[Entry]:
    """Every entry under the root `src` names, parents before children (tagged with `src`,
    where its bytes are read)."""
    try:
        root_fd = os.open(ROOTS[src], NOFOLLOW_DIR)
    except FileNotFoundError:
        return []
    found: list[Entry] = []
    try:
        base = tree_of("")
        top = entry_of(base, "", os.fstat(root_fd), None, "") if base is not None else None
        if top is not None:
            found.append(top)
        _walk(root_fd, "", tree_of, skip, found)
    finally:
        os.close(root_fd)
    for entry in found:
        entry["src"] = src
    return found


def _walk(
    dir_fd: int,
    prefix: str,
    tree_of: Callable[[str], str | None],
    skip: set[str],
    found: list[Entry],
) -> None:
    with os.scandir(dir_fd) as listing:
        names = sorted(item.name for item in listing)
    for name in names:
        path = prefix + name
        if path in skip:
            continue
        tree = tree_of(path)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        entry = entry_of(tree, path, st, dir_fd, name) if tree else None
        if entry is not None:
            found.append(entry)
        if stat.S_ISDIR(st.st_mode):
            try:
                child = os.open(name, NOFOLLOW_DIR, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _walk(child, path + "/", tree_of, skip, found)
            finally:
                os.close(child)


def under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d + "/") for d in dirs)


def merge(lower: list[Entry], upper: list[Entry]) -> list[Entry]:
    """Overlay's view of two layers: what `upper` has replaces `lower`'s, and a whiteout or an
    opaque directory of `upper` hides everything of `lower` beneath it."""
    mine = {entry["p"] for entry in upper}
    hiding = {entry["p"] for entry in upper if entry["k"] == "deleted" or entry.get("o")}

    def hidden(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:n]) in hiding for n in range(1, len(parts)))

    kept = [e for e in lower if e["p"] not in mine and not hidden(e["p"])]
    return sorted(kept + upper, key=lambda e: e["p"].split("/"))


def scan(state: list[str], skip: list[str]) -> list[Entry]:
    """The workspace tree, then what changed outside it (the container's upper directory, over
    the base layer of a sandbox made from a snapshot) split into `state` and `system`."""

    def outside(path: str) -> str | None:
        if path == "":
            return None
        return "state" if under(path, state) else "system"

    entries = walk("ws", lambda p: "workspace", set())
    skipped = set(skip) | SYSTEM_SKIP
    changes = walk("upper", outside, skipped)
    if os.path.isdir(ROOTS["base"]):
        changes = merge(walk("base", outside, skipped), changes)
    return entries + changes


def locate(src: str, path: str) -> tuple[int, str]:
    """The open directory holding `path` under root `src`, and its name (never through a
    link; nothing is made)."""
    parts = path.split("/")
    fd = os.open(ROOTS[src], NOFOLLOW_DIR)
    try:
        for part in parts[:-1]:
            child = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        raise FileNotFoundError(path) from None
    return fd, parts[-1]


def copy_out(entry: Entry, target: str) -> tuple[os.stat_result, os.stat_result]:
    """Copy a file (never through a link) to the staging path; its stat before and after."""
    fd, name = locate(entry["src"], entry["p"])
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        before = os.fstat(src)
        with open(target, "wb") as dst:
            while True:
                data = os.read(src, PIECE)
                if not data:
                    break
                dst.write(data)
        after = os.fstat(src)
    finally:
        os.close(src)
    return before, after


def marks(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def stage(entries: list[Entry], known: dict[str, dict[str, list[Any]]], staged: Staged) -> int:
    """Copy every file whose signature differs from `known` and from its staged copy.
    `staged`: (tree, path) -> (signature, staging file, clean: unchanged while copied and
    since it was listed). Returns the bytes copied."""
    copied = 0
    for entry in entries:
        if entry["k"] != "file":
            continue
        key = (entry["t"], entry["p"])
        sig = signature(entry)
        if known.get(entry["t"], {}).get(entry["p"]) == sig:
            continue
        held = staged.get(key)
        if held is not None and held[0] == sig and held[2]:
            continue
        target = held[1] if held else f"{STAGING}/{len(staged)}"
        try:
            before, after = copy_out(entry, target)
        except FileNotFoundError:
            staged.pop(key, None)
            continue
        clean = marks(before) == marks(after) == sig[4:8]
        staged[key] = (sig, target, clean)
        copied += before.st_size
    return copied


def export(request: dict[str, Any]) -> None:
    known = request.get("known") or {}
    state = request.get("state") or []
    skip = request.get("skip") or []
    os.makedirs(STAGING, exist_ok=True)
    staged: Staged = {}
    precopied = 0
    if request.get("precopy"):
        precopied = stage(scan(state, skip), known, staged)
    send_json(b"J", {"ready": True, "precopied": precopied})
    out.flush()
    kind, payload = read_frame()
    if kind != b"J" or json.loads(payload).get("op") != "go":
        raise SystemExit("expected go")
    listed = scan(state, skip)
    frozen = stage(listed, known, staged)
    entries = []
    for entry in listed:
        entry["c"] = known.get(entry["t"], {}).get(entry["p"]) != signature(entry)
        if entry["k"] == "file" and entry["c"]:
            held = staged.get((entry["t"], entry["p"]))
            if held is None:
                continue  # gone while it was copied: not in this export
            entry["s"] = os.path.getsize(held[1])  # exactly the bytes that follow
        entries.append(entry)
    send_json(b"J", {"done": True, "copied": frozen, "entries": len(entries)})
    out.flush()
    for entry in entries:
        send_json(b"E", entry)
        if entry["k"] == "file" and entry["c"]:
            _, target, _ = staged[(entry["t"], entry["p"])]
            with open(target, "rb") as staged_file:
                while True:
                    data = staged_file.read(PIECE)
                    if not data:
                        break
                    send(b"B", data)
    send(b"Z", b"")
    out.flush()


def parent_of(root_fd: int, path: str) -> tuple[int, str]:
    """A descriptor of the directory holding `path` (made as needed, never through a link)."""
    parts = path.split("/")
    fd = os.dup(root_fd)
    for part in parts[:-1]:
        if part in ("", ".", ".."):
            os.close(fd)
            raise SystemExit(f"bad path {path!r}")
        try:
            child = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
        except FileNotFoundError:
            os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
        os.close(fd)
        fd = child
    name = parts[-1]
    if name in ("", ".", "..") or "/" in name:
        os.close(fd)
        raise SystemExit(f"bad path {path!r}")
    return fd, name


def clear(fd: int, name: str) -> os.stat_result | None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=fd)
        return None
    return st


def write_entry(
    root_fd: int, entry: Entry, dirs: list[tuple[int, str, int]]
) -> tuple[int, str, int] | None:
    kind = entry["k"]
    if entry["p"] == "":
        os.chown(root_fd, entry["u"], entry["g"])
        os.chmod(root_fd, entry["m"])
        dirs.append((root_fd, "", entry["mt"]))
        return None
    fd, name = parent_of(root_fd, entry["p"])
    existing = clear(fd, name)
    if kind == "dir":
        if existing is None:
            os.mkdir(name, 0o700, dir_fd=fd)
        os.chown(name, entry["u"], entry["g"], dir_fd=fd, follow_symlinks=False)
        os.chmod(name, entry["m"], dir_fd=fd, follow_symlinks=False)
        if entry.get("o"):
            os.setxattr(f"/proc/self/fd/{fd}/{name}", OPAQUE[0], b"y")
        dirs.append((root_fd, entry["p"], entry["mt"]))
        os.close(fd)
        return None
    if existing is not None:
        raise SystemExit(f"a directory stands where {entry['p']!r} goes")
    if kind == "symlink":
        os.symlink(entry["l"], name, dir_fd=fd)
    elif kind == "deleted":
        os.mknod(name, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=fd)
    elif kind == "file":
        target = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd
        )
        return fd, name, target
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    finish(fd, name, entry, None)
    os.close(fd)
    return None


def finish(fd: int, name: str, entry: Entry, file_fd: int | None) -> None:
    if file_fd is not None:
        os.fchown(file_fd, entry["u"], entry["g"])
        os.fchmod(file_fd, entry["m"])  # after the owner: a chown clears set-id bits
        os.close(file_fd)
    else:
        os.chown(name, entry["u"], entry["g"], dir_fd=fd, follow_symlinks=False)
    os.utime(name, ns=(entry["mt"], entry["mt"]), dir_fd=fd, follow_symlinks=False)


def import_(request: dict[str, Any]) -> None:
    roots = {}
    for tree, path in request["roots"].items():
        os.makedirs(path, 0o755, exist_ok=True)
        roots[tree] = os.open(path, NOFOLLOW_DIR)
    dirs: list[tuple[int, str, int]] = []
    written = 0
    entry: Entry = {}
    open_file = None
    while True:
        kind, payload = read_frame()
        if kind == b"B":
            if open_file is None:
                raise SystemExit("bytes without a file")
            os.write(open_file[2], payload)
            written += len(payload)
            continue
        if open_file is not None:
            finish(open_file[0], open_file[1], entry, open_file[2])
            os.close(open_file[0])
            open_file = None
        if kind == b"Z":
            break
        entry = json.loads(payload)
        root = roots.get(entry["t"])
        if root is None:
            continue
        open_file = write_entry(root, entry, dirs)
    for root_fd, path, mtime in reversed(dirs):  # writing into a directory changes its time
        if path == "":
            os.utime(root_fd, ns=(mtime, mtime))
            continue
        fd, name = parent_of(root_fd, path)
        os.utime(name, ns=(mtime, mtime), dir_fd=fd, follow_symlinks=False)
        os.close(fd)
    send_json(b"J", {"done": True, "bytes": written})
    out.flush()


def forkdirs(request: dict[str, Any]) -> None:
    base = request["base"]
    lower = os.stat(base + "/lower")
    for sandbox_id in request["ids"]:
        if not sandbox_id.isalnum():
            raise SystemExit(f"bad id {sandbox_id!r}")
        for sub in ("up", "work"):
            os.makedirs(f"{base}/forks/{sandbox_id}/{sub}", 0o700, exist_ok=True)
        upper = f"{base}/forks/{sandbox_id}/up"
        os.chown(upper, lower.st_uid, lower.st_gid)
        os.chmod(upper, stat.S_IMODE(lower.st_mode))
    send_json(b"J", {"done": True})
    out.flush()


def main() -> None:
    _, payload = read_frame()
    request = json.loads(payload)
    op = request.get("op")
    if op == "export":
        export(request)
    elif op == "import":
        import_(request)
    elif op == "forkdirs":
        forkdirs(request)
    else:
        raise SystemExit(f"unknown op {op!r}")


if __name__ == "__main__":
    main()
