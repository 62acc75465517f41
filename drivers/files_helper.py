"""The program the drivers run in a short-lived helper (a container on Docker, a pod on
Kubernetes) to read a sandbox's files consistently, and on Kubernetes to write a restored
sandbox's files (drivers/docker/files.py, drivers/kubernetes/files.py). It is sent as
`python3 -I -S -c <this file>` and must run on any Python 3.9+ with the standard library alone,
since it runs in the helper image (ACS_SNAPSHOT_HELPER_IMAGE), not in the control plane.

Mounts (read-only, but a fork's /acs/into below): /acs/ws (the workspace volume), /acs/upper
(the container's own writable layer, the overlay "upper" directory: what changed outside the
workspace, with whiteouts for what was deleted from the image) and, for a sandbox made from a
snapshot, /acs/base (the base image's top layer, which holds that snapshot's changes: the two
are merged as overlay does).
Nothing is ever followed through a symbolic link: every path is walked from a directory
descriptor with O_NOFOLLOW, so a tree the agent shaped cannot send a read elsewhere.

Messages both ways are frames: one type byte, a 4-byte big-endian length, the payload.
J: a JSON object; Z: the end.

{"op": "export", "known_file": path, "state": [dirs], "skip": [dirs], "precopy": bool}, the
file holding `known`, {tree: {path: signature}} (put there by the engine before the helper
started): scan the trees and, with `precopy`, copy what changed since `known` to a staging
directory while the sandbox still runs, then say {"ready": ...}. The control plane
holds the sandbox still and answers {"op": "go"}: the trees are scanned again and only what
changed meanwhile is copied, then {"done": ...}; the control plane lets the sandbox go on. The
listing (a JSON array; each changed file named, "n", by its staged copy; an entry whose
signature is the known one only as {"t", "p", "c": false}, since the control plane holds it) is
written beside the copies in /acs/ready, and Z says so: the control plane reads that directory
as one archive from the engine (far faster than this stream).
A fork's export on Docker also mounts the new base volume (read-write, /acs/into) and names
"staging" and "ready" there, and "place" (the base's lower/, made here): after Z the helper lays
the workspace tree down there from the listing, each file a hard link of its staged copy, while
the engine streams the copies; it answers {"placed": n, "bytes": b, "missed": m, "skipped":
[paths]}, and on {"op": "clean"} (the control plane read the whole archive) removes its staging
and ready directories, answered {"cleaned": n} (`place_then_clean`).
Either look may refuse instead, before anything is copied: {"too_large": bytes, "limit": n}
(the changed files are over "max_bytes"; with "scratch": true, they need more than the
"scratch_bytes" the staging directory may hold) or {"too_deep": MAX_DEPTH, "tree": t, "path": p} (a
path nests deeper than the walk goes).

Kubernetes (no engine, no overlay layer within reach) adds to the export request: "roots" (the
claim's `workspace/` as "ws" and its `state/` as "upper"), "staging" (a directory of the
helper's own), "system": false (only the state paths of "upper" are listed, nothing else of it)
and "stream": true: after {"done": ...} the listing goes as one L frame, then each changed
file's bytes as F frames (exactly its listed size), then Z. And the op "load" writes a restored
sandbox's files under "root": E frames (an entry: "d", the path under root; "k", "m", "mt",
"l"; for a file, "t", "p" and "w": its tree, path and signature in the snapshot), each file's
bytes as F frames, then Z; answered {"loaded": n, "skipped": m, "carried": c}, and each file
laid down as the snapshot had it is recorded, its signature as laid down beside "w", in
"carried.json" under root for the exports that follow (`carry`). Nothing is written through a
link, beneath anything but a directory, nor outside root.

Across a restore on Docker, where the engine lays the files down: the op "stamp" records
each file's signature as laid down beside its signature in the snapshot; an export request's
"carried_file" names that record (or the loader's, on Kubernetes), so that the first export
after a restore, a rewind or a fork reads only what changed since (`carry`), not every file.
And the op "reuse" lays a rewind's unchanged files into the new base from the old workspace
(hard links), so that a rewind reads only what changed out of the store.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import stat
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

Entry = dict[str, Any]
Staged = dict[tuple[str, str], tuple[list[Any], str, bool]]

PIECE = 1 << 20
BLOCK = 4096
# Only the trusted.* attribute, which the engine's overlayfs sets and the agent cannot: an
# unprivileged user may set user.overlay.opaque on its own directories.
OPAQUE = ("trusted.overlay.opaque",)
STAGING = ["/acs/staging"]  # a list: an export request may name another
READY = ["/acs/ready"]  # the same ("ready")
CARRIED_NAME = "carried.json"
LISTING = "-listing.json"
ROOTS = {"ws": "/acs/ws", "upper": "/acs/upper", "base": "/acs/base"}
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
SYSTEM_SKIP = {".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf", "proc", "sys", "dev"}
MAX_DEPTH = 256
"""A path of more than this many names below a tree's root stops the export (answered
{"too_deep": ...}): the walk holds one open directory and one Python frame per level, and a tree
the agent nests thousands deep would otherwise end the helper (RecursionError, EMFILE) with no
clear word. Real trees (node_modules, build outputs) stay far below it."""

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
    tree: str, path: str, st: os.stat_result, parent_fd: int | None, name: str, *, layer: bool
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
    if kind == "dir" and parent_fd is not None and layer:  # an overlay layer's, not a volume's
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


SEEN: dict[tuple[str, str], tuple[tuple[int, ...], Entry]] = {}
"""What the last walk found, by (root, path): the next walk (the one while the sandbox is held
still) reuses an entry whose stat did not change instead of making it again."""


class TooDeep(Exception):
    """A directory nested deeper than MAX_DEPTH below its tree's root (args: tree, path)."""


def walk(src: str, tree_of: Callable[[str], str | None], skip: set[str]) -> list[Entry]:
    """Every entry under the root `src` names, parents before children (tagged with `src`,
    where its bytes are read). Raises TooDeep past MAX_DEPTH levels."""
    try:
        root_fd = os.open(ROOTS[src], NOFOLLOW_DIR)
    except FileNotFoundError:
        return []
    found: list[Entry] = []
    try:
        base = tree_of("")
        top = (
            entry_of(base, "", os.fstat(root_fd), None, "", layer=False)
            if base is not None
            else None
        )
        if top is not None:
            top["src"] = src
            found.append(top)
        _walk(root_fd, src, "", tree_of=tree_of, skip=skip, found=found)
    finally:
        os.close(root_fd)
    return found


def _walk(
    dir_fd: int,
    src: str,
    prefix: str,
    *,
    tree_of: Callable[[str], str | None],
    skip: set[str],
    found: list[Entry],
    depth: int = 1,
) -> None:
    with os.scandir(dir_fd) as listing:
        names = sorted(item.name for item in listing)
    if names and depth > MAX_DEPTH:
        raise TooDeep(tree_of(prefix + names[0]) or "system", prefix + names[0])
    layer = src != "ws"
    for name in names:
        path = prefix + name
        if path in skip:
            continue
        tree = tree_of(path)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if tree:
            mark = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
                    st.st_ctime_ns, st.st_ino)  # fmt: skip
            seen = SEEN.get((src, path))
            if seen is not None and seen[0] == mark:
                entry: Entry | None = seen[1]
            else:
                entry = entry_of(tree, path, st, dir_fd, name, layer=layer)
                if entry is not None:
                    entry["src"] = src
                    SEEN[(src, path)] = (mark, entry)
            if entry is not None:
                found.append(entry)
        if stat.S_ISDIR(st.st_mode):
            try:
                child = os.open(name, NOFOLLOW_DIR, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _walk(
                    child,
                    src,
                    path + "/",
                    tree_of=tree_of,
                    skip=skip,
                    found=found,
                    depth=depth + 1,
                )
            finally:
                os.close(child)


def under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d + "/") for d in dirs)


def merge(lower: list[Entry], upper: list[Entry]) -> list[Entry]:
    """Overlay's view of two layers: what `upper` has replaces `lower`'s, and a whiteout, an
    opaque directory or anything but a directory (a link, a file) of `upper` hides everything
    of `lower` beneath it: a link the agent put where the image had a directory must never
    carry that directory's children, which a restore would write through the link."""
    mine = {entry["p"] for entry in upper}
    hiding = {entry["p"] for entry in upper if entry["k"] != "dir" or entry.get("o")}

    def hidden(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:n]) in hiding for n in range(1, len(parts)))

    kept = [e for e in lower if e["p"] not in mine and not hidden(e["p"])]
    return sorted(kept + upper, key=lambda e: e["p"].split("/"))


def scan(state: list[str], skip: list[str], system: bool = True) -> list[Entry]:
    """The workspace tree, then what changed outside it (the container's upper directory, over
    the base layer of a sandbox made from a snapshot) split into `state` and `system` (or, with
    `system` false, only what lies under the state paths)."""

    def outside(path: str) -> str | None:
        if path == "":
            return None
        if under(path, state):
            return "state"
        return "system" if system else None

    entries = walk("ws", lambda p: "workspace", set())
    skipped = set(skip) | SYSTEM_SKIP
    changes = walk("upper", outside, skipped)
    if "base" in ROOTS and os.path.isdir(ROOTS["base"]):
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


class NotRegular(Exception):
    """What was listed as a regular file is something else now (the agent swapped it)."""


def copy_out(entry: Entry, target: str) -> tuple[os.stat_result, os.stat_result]:
    """Copy a file (never through a link) to the staging path; its stat before and after.
    Raises NotRegular when it is no longer a regular file: a fifo swapped in while the sandbox
    runs would block the open, then the reads, for as long as the agent likes (opened without
    blocking, checked before anything is read)."""
    fd, name = locate(entry["src"], entry["p"])
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        before = os.fstat(src)
        if not stat.S_ISREG(before.st_mode):
            raise NotRegular(entry["p"])
        # At most the listed size, which the size limit was checked against: a file the agent
        # grows (or turns sparse and huge) meanwhile is cut here, its stat then differs from
        # the listing and it is copied again while the sandbox is held still, listed anew.
        left = int(entry["s"])
        with open(target, "wb") as dst:
            while left > 0:
                data = os.read(src, min(PIECE, left))
                if not data:
                    break
                dst.write(data)
                left -= len(data)
        after = os.fstat(src)
    finally:
        os.close(src)
    return before, after


def marks(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


NAMES = itertools.count()
"""The staging copies' names: never one still in use (an entry popped from `staged` must
not give its number to the next)."""
SKIPPED: list[str] = []
"""Files no longer regular when they were to be copied (reported: the export leaves them out
unless a later look finds them regular again)."""
SHOWN = 20
"""How many of the paths an answer names (it counts them all): the agent names them, and the
control plane logs them."""
SHOWN_LENGTH = 120
"""How much of a path an answer shows (a path may be thousands of bytes long)."""


def shown(path: str) -> str:
    """A path as an answer shows it (the control plane logs it): at most SHOWN_LENGTH
    characters, a longer one cut and marked."""
    return path if len(path) <= SHOWN_LENGTH else path[:SHOWN_LENGTH] + "..."


def shown_all(paths: list[str]) -> list[str]:
    """The first SHOWN of `paths`, each `shown`: what an answer names of them."""
    return [shown(path) for path in paths[:SHOWN]]


def stage(entries: list[Entry], known: dict[str, dict[str, list[Any]]], staged: Staged) -> int:
    """Copy every file whose signature differs from `known` and from its staged copy.
    `staged`: (tree, path) -> (signature, staging file, clean: unchanged while copied and
    since it was listed). Returns the bytes copied."""
    copied = 0
    for entry in entries:
        if entry["k"] != "file":
            continue
        if is_known(entry, known):
            continue
        key = (entry["t"], entry["p"])
        sig = signature(entry)
        held = staged.get(key)
        if held is not None and held[0] == sig and held[2]:
            continue
        target = held[1] if held else f"{STAGING[0]}/{next(NAMES)}"
        try:
            before, after = copy_out(entry, target)
        except FileNotFoundError:
            staged.pop(key, None)
            continue
        except (NotRegular, OSError):  # swapped for a fifo, a link (ELOOP), ...: the agent's
            staged.pop(key, None)
            SKIPPED.append(entry["p"])
            continue
        clean = marks(before) == marks(after) == sig[4:8]
        staged[key] = (sig, target, clean)
        copied += min(before.st_size, int(entry["s"]))
    return copied


def is_known(entry: Entry, known: dict[str, dict[str, list[Any]]]) -> bool:
    """Its signature is the one the export already knows. Kept on the entry ("_k"), which a
    later look reuses while its stat is the same (SEEN): each look asks several times."""
    found = entry.get("_k")
    if found is None:
        found = entry["_k"] = known.get(entry["t"], {}).get(entry["p"]) == signature(entry)
    return bool(found)


def changed_file(entry: Entry, known: dict[str, dict[str, list[Any]]]) -> bool:
    """A file whose signature is not the one the export already knows: its bytes are copied."""
    return entry["k"] == "file" and not is_known(entry, known)


def changed_bytes(entries: list[Entry], known: dict[str, dict[str, list[Any]]]) -> int:
    """What copying the files that changed would take (their sizes as listed)."""
    return sum(entry["s"] for entry in entries if changed_file(entry, known))


def staging_bytes(entries: list[Entry], known: dict[str, dict[str, list[Any]]]) -> int:
    """What staging the files that changed takes on disk: each rounded up to whole blocks, as
    a volume's usage is counted (a Kubernetes emptyDir's against its sizeLimit)."""
    return sum(
        -(-int(entry["s"]) // BLOCK) * BLOCK for entry in entries if changed_file(entry, known)
    )


def refuse_if_large(
    entries: list[Entry], known: dict[str, dict[str, list[Any]]], limit: int, scratch: int = 0
) -> bool:
    """Before anything is copied: a sandbox whose changed files (a sparse file of any size
    included) are over `limit` bytes, or need more than the `scratch` bytes the staging
    directory may hold, is refused, and the caller told so."""
    total = changed_bytes(entries, known) if limit else 0
    if limit and total > limit:
        send_json(b"J", {"too_large": total, "limit": limit})
        out.flush()
        return True
    need = staging_bytes(entries, known) if scratch else 0
    if scratch and need > scratch:
        send_json(b"J", {"too_large": need, "limit": scratch, "scratch": True})
        out.flush()
        return True
    return False


def prune(listed: list[Entry], known: dict[str, dict[str, list[Any]]], staged: Staged) -> None:
    """Staged copies the last look no longer wants (the file gone, or back as it was known)
    removed: the staging directory then never holds more than that look's changed files,
    which the scratch limit was checked against."""
    wanted = {(entry["t"], entry["p"]) for entry in listed if changed_file(entry, known)}
    for key in [key for key in staged if key not in wanted]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged.pop(key)[1])


def looked(state: list[str], skip: list[str], system: bool) -> list[Entry] | None:
    """`scan`, or None once the caller is told the trees nest too deep (nothing is copied)."""
    try:
        return scan(state, skip, system)
    except TooDeep as exc:
        tree, path = exc.args
        send_json(b"J", {"too_deep": MAX_DEPTH, "tree": tree, "path": shown(path)})
        out.flush()
        return None


def configure(request: dict[str, Any], known: dict[str, dict[str, list[Any]]]) -> None:
    """An export request's roots, carried signatures, staging and ready directories."""
    if request.get("roots"):
        ROOTS.clear()
        ROOTS.update(request["roots"])
    if request.get("carried_file"):
        carry(known, request["carried_file"])
    if request.get("staging"):
        STAGING[0] = request["staging"]
    if request.get("ready"):
        READY[0] = request["ready"]


def export(request: dict[str, Any]) -> None:
    began = time.monotonic()
    known: dict[str, dict[str, list[Any]]] = request.get("known") or {}
    if request.get("known_file"):
        with open(request["known_file"]) as known_file:
            known = json.loads(known_file.read())
    configure(request, known)
    system = bool(request.get("system", True))
    state = request.get("state") or []
    skip = request.get("skip") or []
    os.makedirs(STAGING[0], exist_ok=True)
    staged: Staged = {}
    precopied = 0
    limit = int(request.get("max_bytes") or 0)
    scratch = int(request.get("scratch_bytes") or 0)
    if request.get("precopy"):
        first = looked(state, skip, system)
        if first is None or refuse_if_large(first, known, limit, scratch):
            return
        precopied = stage(first, known, staged)
    answer = {"ready": True, "precopied": precopied, "skipped": shown_all(SKIPPED)}
    send_json(b"J", {**answer, "took": time.monotonic() - began})
    out.flush()
    kind, payload = read_frame()
    if kind != b"J" or json.loads(payload).get("op") != "go":
        raise SystemExit("expected go")
    began = time.monotonic()
    listed = looked(state, skip, system)
    if listed is None or refuse_if_large(listed, known, limit, scratch):
        return
    prune(listed, known, staged)
    frozen = stage(listed, known, staged)
    done = {"done": True, "copied": frozen, "skipped": shown_all(SKIPPED)}
    send_json(b"J", {**done, "took": time.monotonic() - began})
    out.flush()
    if request.get("stream"):
        stream(listed, known, staged)
        return
    # The sandbox goes on. The staged copies are renamed in the listing's order into the
    # directory the control plane then reads as one archive (sorted by name: that order).
    os.makedirs(READY[0], exist_ok=True)

    def ready(entry: Entry, copy: str, index: int) -> str:
        entry["n"] = f"{index:09d}"
        os.rename(copy, f"{READY[0]}/{entry['n']}")
        return f"{READY[0]}/{entry['n']}"

    entries, _ = final_listing(listed, known, staged, ready)
    # The listing goes with the copies, first in the archive's order ("-" sorts before digits).
    with open(f"{READY[0]}/{LISTING}", "w") as listing:
        listing.write(json.dumps(entries, separators=(",", ":")))  # dumps: the C encoder
    send(b"Z", b"")
    out.flush()
    if request.get("place"):
        place_then_clean(entries, request)


def place_then_clean(entries: list[Entry], request: dict[str, Any]) -> None:
    """A fork's export staged in the new base volume (its "staging" and "ready" there): while
    the engine streams the copies to the control plane, the workspace tree is laid down in
    "place" (the base's lower/, which must not exist) from the listing, each file a hard link
    of its staged copy (no byte written twice, `place`); with "place_system" (the writable
    layer of the container the base image is committed from, empty), the system tree there
    too (each file a copy: another filesystem mount; whiteouts and opaque directories as
    overlay takes them), and with "forks" (sandbox ids) each one's upper and work directories
    under the base's forks/ (`make_forks`): the base is then whole without the stream, and
    its image can be committed while the engine still streams the copies. Answered at once
    {"placed": n, "listed": w, "bytes": b, "missed": m, "skipped": [paths], "root": "u:g:m",
    "system": s, "reserved": r, "forks": f} ("reserved": system entries named as whiteouts,
    left out: `place`). Then, once the control plane has read the copies ({"op":
    "clean"}), the staging and ready directories are removed (the linked files keep their
    lower/ name alone), answered {"cleaned": n}."""
    try:
        answer = place(entries, READY[0], request["place"])
        if request.get("place_system"):
            system = place(entries, READY[0], request["place_system"], tree="system")
            answer["system"] = system["placed"]
            answer["reserved"] = system["reserved"]
            answer["missed"] += system["missed"]
            answer["skipped"] = shown_all(answer["skipped"] + system["skipped"])
        if request.get("forks") is not None:
            answer["forks"] = make_forks(entries, request["place"], request["forks"])
    except Exception as exc:  # the whole placement: the control plane builds no base of it
        answer = {"placed": 0, "bytes": 0, "missed": -1, "skipped": [], "error": str(exc)}
    send_json(b"J", answer)
    out.flush()
    kind, payload = read_frame()
    if kind != b"J" or json.loads(payload).get("op") != "clean":
        raise SystemExit("expected clean")
    cleaned = sum(empty_out(where) for where in (READY[0], STAGING[0]))
    send_json(b"J", {"cleaned": cleaned})
    out.flush()


def make_forks(entries: list[Entry], lower: str, sandbox_ids: list[str]) -> int:
    """Beside `lower` (the base's lower/), forks/ and per sandbox its overlay upper directory
    (owner and mode those of the workspace root: overlay's merged root is the upper
    directory) and work directory; how many sandboxes."""
    root = next((e for e in entries if e.get("t") == "workspace" and e.get("p") == ""), None)
    if root is None or root.get("c") is False:
        raise OSError("the listing has no workspace root")
    base_fd = os.open(os.path.dirname(lower.rstrip("/")), NOFOLLOW_DIR)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir("forks", 0o755, dir_fd=base_fd)
        forks_fd = os.open("forks", NOFOLLOW_DIR, dir_fd=base_fd)
    finally:
        os.close(base_fd)
    try:
        os.fchmod(forks_fd, 0o755)
        for sandbox_id in sandbox_ids:
            if parts_of(sandbox_id) != [sandbox_id]:
                raise OSError(f"not a sandbox id: {shown(sandbox_id)}")
            os.mkdir(sandbox_id, 0o700, dir_fd=forks_fd)
            top = os.open(sandbox_id, NOFOLLOW_DIR, dir_fd=forks_fd)
            try:
                os.fchmod(top, 0o700)
                os.mkdir("up", 0o700, dir_fd=top)
                os.mkdir("work", 0o700, dir_fd=top)
                up = os.open("up", NOFOLLOW_DIR, dir_fd=top)
                try:
                    os.fchown(up, int(root["u"]), int(root["g"]))
                    os.fchmod(up, int(root["m"]) & 0o7777)
                finally:
                    os.close(up)
            finally:
                os.close(top)
    finally:
        os.close(forks_fd)
    return len(sandbox_ids)


def empty_out(where: str) -> int:
    """Remove the directory `where` and the files in it (the helper's own copies: flat, no
    subdirectory); how many files."""
    try:
        fd = os.open(where, NOFOLLOW_DIR)
    except FileNotFoundError:
        return 0
    try:
        names = os.listdir(fd)
        for name in names:
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(where)
    return len(names)


def place(
    entries: list[Entry], ready: str, target: str, *, tree: str = "workspace"
) -> dict[str, Any]:
    """The listing's `tree` laid down under `target` with every owner, mode, time (0 too: the
    listing's times are the scan's own), link target, whiteout and opaque directory as
    listed. The workspace tree: `target` is made here (it must not exist) and a file is a
    hard link of its staged copy in `ready` (same filesystem: the base volume), which must be
    the size listed. The system tree: `target` exists (an empty writable layer, another
    mount) and a file is a copy of its staged one. Nothing is followed through a link, made
    beneath anything but a directory, nor outside `target`; an entry that cannot be made is
    counted ("missed") and named (`shown_all`). "listed": the tree's entries in the listing;
    "opened": the directories opened (`Parents`). In the system tree, an entry whose name (or
    a parent's) is a whiteout's (`reserved`) is left out, counted ("reserved"): in the layer
    the base's image is committed from, the engine would take it for a whiteout and hide
    the file it names (or, as ".wh..wh..opq", the image's whole directory) in every fork."""
    if tree == "workspace":
        os.mkdir(target, 0o700)
    root_fd = os.open(target, NOFOLLOW_DIR)
    ready_fd = os.open(ready, NOFOLLOW_DIR)
    parents = Parents(root_fd)
    dirs: list[tuple[list[str], Entry]] = []
    placed = size = listed = reserved = 0
    skipped: list[str] = []
    try:
        for entry in entries:
            if entry.get("t") != tree:
                continue
            listed += 1
            if tree != "workspace" and is_reserved(str(entry.get("p"))):
                reserved += 1
                continue
            try:
                size += place_entry(parents, ready_fd, entry, dirs, copy=tree != "workspace")
            except OSError:
                skipped.append(str(entry.get("p")))
                continue
            placed += 1
        finish_dirs(root_fd, dirs, owners=True, parents=parents, exact=True)
    finally:
        parents.close()
        os.close(ready_fd)
        os.close(root_fd)
    root = next((e for e in entries if e.get("t") == tree and e.get("p") == ""), None)
    return {
        "placed": placed,
        "listed": listed,
        "bytes": size,
        "missed": len(skipped),
        "skipped": shown_all(skipped),
        "reserved": reserved,
        "opened": parents.opened,
        "root": "" if root is None else f"{root.get('u')}:{root.get('g')}:{root.get('m')}",
    }


class Parents:
    """The directories above the last entry `place` made, opened from the root one name at a
    time without following a link, and kept open: the next entry opens only the names its
    parent does not share with the last one's (a directory's entries, listed together, open
    it once, not every level of it once each). A kept descriptor is safe to write through:
    it is the directory opened, whatever is put at its path later, and `place` alone writes
    below its root (the new base's lower/, mounted nowhere else), never removing or renaming
    anything. `opened`: how many directories were opened."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.names: list[str] = []
        self.fds: list[int] = []
        self.opened = 0

    def of(self, parts: list[str]) -> int | None:
        """The directory holding the last of `parts` (kept: the caller does not close it);
        None when a parent is missing or is not a directory (the entry is skipped)."""
        wanted = parts[:-1]
        shared, most = 0, min(len(self.names), len(wanted))
        while shared < most and self.names[shared] == wanted[shared]:
            shared += 1
        self._close_below(shared)
        fd = self.fds[-1] if self.fds else self.root_fd
        for name in wanted[shared:]:
            try:
                fd = os.open(name, NOFOLLOW_DIR, dir_fd=fd)
            except OSError:
                return None
            self.opened += 1
            self.names.append(name)
            self.fds.append(fd)
        return fd

    def _close_below(self, depth: int) -> None:
        while len(self.fds) > depth:
            self.names.pop()
            os.close(self.fds.pop())

    def close(self) -> None:
        self._close_below(0)


def place_entry(
    parents: Parents,
    ready_fd: int,
    entry: Entry,
    dirs: list[tuple[list[str], Entry]],
    *,
    copy: bool = False,
) -> int:
    """Make one listed entry under root (a directory's owner, mode and time come at the end:
    `finish_dirs`; its overlay opacity now); the bytes of a file linked (`copy`: copied).
    Raises OSError to skip it."""
    if entry.get("c") is False:
        raise OSError("an unchanged entry has no staged copy")
    if entry["p"] == "":
        dirs.append(([], entry))  # the root itself
        return 0
    parts = parts_of(entry["p"])
    if parts is None:
        raise OSError("a path that leaves the root")
    fd = parents.of(parts)
    if fd is None:
        raise OSError("a parent that is missing or not a directory")
    name = parts[-1]
    uid, gid, ns = int(entry["u"]), int(entry["g"]), int(entry["mt"])
    if entry["k"] == "dir":
        os.mkdir(name, 0o700, dir_fd=fd)
        dirs.append((parts, entry))
        if entry.get("o"):
            make_opaque(fd, name)
        return 0
    if entry["k"] in ("symlink", "deleted"):
        if entry["k"] == "symlink":
            os.symlink(entry.get("l", ""), name, dir_fd=fd)
        else:  # a whiteout, as the engine's extraction makes it (a 0/0 character device)
            mode = stat.S_IFCHR | (int(entry["m"]) & 0o7777)
            os.mknod(name, mode, os.makedev(0, 0), dir_fd=fd)
        os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
        os.utime(name, ns=(ns, ns), dir_fd=fd, follow_symlinks=False)
        return 0
    staged = str(entry.get("n", ""))
    if entry["k"] != "file" or not staged.isdigit():
        raise OSError("not kept here")
    lay_file(ready_fd, staged, fd, name, copy=copy)
    file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    try:
        st = os.fstat(file_fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != int(entry["s"]):
            raise OSError("the staged copy is not the one listed")
        os.fchown(file_fd, uid, gid)  # before the mode: a chown clears set-id bits
        os.fchmod(file_fd, int(entry["m"]) & 0o7777)
        os.utime(file_fd, ns=(ns, ns))
    finally:
        os.close(file_fd)
    return st.st_size


WHITEOUT_PREFIX = ".wh."
"""What an image layer's whiteouts are named (the OCI image spec reserves it): a file the agent
names so in a layer tree would be one once committed (drivers/docker/bases.py: `reserved`)."""


def is_reserved(path: str) -> bool:
    """A path with a name (its own or a parent's) that an image layer takes for a whiteout."""
    return any(name.startswith(WHITEOUT_PREFIX) for name in path.split("/"))


def lay_file(ready_fd: int, staged: str, fd: int, name: str, *, copy: bool) -> None:
    """The file `name` in `fd` made of its staged copy: a hard link of it, or (`copy`) a copy
    of its bytes."""
    if copy:
        copy_staged(ready_fd, staged, fd, name)
    else:
        os.link(staged, name, src_dir_fd=ready_fd, dst_dir_fd=fd, follow_symlinks=False)


def make_opaque(fd: int, name: str) -> None:
    """The directory `name` in `fd` made opaque as overlay takes it (a system tree's
    directory that replaces the image's)."""
    made = os.open(name, NOFOLLOW_DIR, dir_fd=fd)
    try:
        os.setxattr(made, OPAQUE[0], b"y")
    finally:
        os.close(made)


def write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def copy_staged(ready_fd: int, staged: str, fd: int, name: str) -> None:
    """A staged copy's bytes into a new file `name` (never through a link) in the directory
    `fd`, in the kernel where it can (copy_file_range)."""
    source = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=ready_fd)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        target = os.open(name, flags, 0o600, dir_fd=fd)
        try:
            left = os.fstat(source).st_size
            while left > 0:
                try:
                    done = os.copy_file_range(source, target, left)
                except OSError:  # a kernel or filesystem without it: through this process
                    done = write_all(target, os.read(source, min(left, PIECE)))
                if done <= 0:
                    break
                left -= done
        finally:
            os.close(target)
    finally:
        os.close(source)


def carry(known: dict[str, dict[str, list[Any]]], carried_file: str) -> None:
    """Known signatures carried across a restore: the file (written by "stamp" when the
    restored files were laid down) maps {tree: {path: [signature in the snapshot, signature as
    laid down]}}; a known entry whose signature is the snapshot's is compared with the one as
    laid down instead, so a restored file untouched since is not read again. One changed after
    the restore has another ctime (any write, chmod or `touch -d` sets it to now): read again.
    No file (a restore made before this existed): nothing is carried."""
    try:
        with open(carried_file) as handle:
            carried = json.loads(handle.read())
    except (OSError, ValueError):
        return
    for tree, paths in carried.items():
        mine = known.get(tree)
        if not mine:
            continue
        for path, (was, laid) in paths.items():
            if mine.get(path) == was:
                mine[path] = laid


def stamp(request: dict[str, Any]) -> None:
    """{"op": "stamp", "entries_file": path ({tree: {path: signature in the snapshot}}),
    "roots": {tree: dir}, "out": path}: once restored files are laid down (and before any
    sandbox runs on them), each file's signature as it now is, written to "out" beside its
    snapshot signature for `carry`, when nothing but the runtime's change marks differ (same
    kind, mode, owner, size, mtime: it is the snapshot's file as it was); answered
    {"stamped": n, "missed": m}."""
    with open(request["entries_file"]) as handle:
        wanted: dict[str, dict[str, list[Any]]] = json.loads(handle.read())
    ROOTS.clear()
    ROOTS.update(request["roots"])
    carried: dict[str, dict[str, list[Any]]] = {}
    stamped = missed = 0
    for tree, paths in wanted.items():
        if tree not in ROOTS:
            continue
        for path, was in paths.items():
            try:
                fd, name = locate(tree, path)
            except OSError:
                missed += 1
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                entry = entry_of(tree, path, st, fd, name, layer=False)
            except OSError:
                entry = None
            finally:
                os.close(fd)
            laid = signature(entry) if entry is not None else None
            if laid is None or not carriable(was, laid):
                missed += 1
                continue
            carried.setdefault(tree, {})[path] = [was, laid]
            stamped += 1
    written = request["out"] + ".part"
    with open(written, "w") as handle:
        handle.write(json.dumps(carried, separators=(",", ":")))
    os.rename(written, request["out"])
    send_json(b"J", {"stamped": stamped, "missed": missed})
    out.flush()


def final_listing(
    listed: list[Entry],
    known: dict[str, dict[str, list[Any]]],
    staged: Staged,
    place: Callable[[Entry, str, int], str],
) -> tuple[list[Entry], list[str]]:
    """The export's entries, each marked changed or not ("c"), a changed file's size that of
    its staged copy, which `place(entry, copy, index)` puts where it is sent from (the paths
    returned, in order); a file gone while it was copied is left out."""
    entries: list[Entry] = []
    copies: list[str] = []
    for entry in listed:
        if is_known(entry, known):
            # Unchanged: the control plane holds this very entry (it sent its signature), so
            # it is named, not described again (far less listing to write, send and read).
            entries.append({"t": entry["t"], "p": entry["p"], "c": False})
            continue
        entry["c"] = True
        if entry["k"] == "file":
            held = staged.pop((entry["t"], entry["p"]), None)
            if held is None:
                continue  # gone while it was copied: not in this export
            copy = place(entry, held[1], len(entries))
            entry["s"] = os.path.getsize(copy)  # exactly what is sent
            copies.append(copy)
        entry.pop("src", None)
        entry.pop("_k", None)
        entries.append(entry)
    return entries, copies


def stream(listed: list[Entry], known: dict[str, dict[str, list[Any]]], staged: Staged) -> None:
    """The listing (L), then each changed file's staged bytes (F frames, exactly its listed
    size), then Z: all on stdout (Kubernetes: through the API server's exec stream)."""
    entries, copies = final_listing(listed, known, staged, lambda _entry, copy, _index: copy)
    send(b"L", json.dumps(entries, separators=(",", ":")).encode())
    for copy in copies:
        with open(copy, "rb") as staged_file:
            while True:
                data = staged_file.read(PIECE)
                if not data:
                    break
                send(b"F", data)
        os.unlink(copy)
    send(b"Z", b"")
    out.flush()


def parts_of(path: str) -> list[str] | None:
    """A relative path's names; None for anything that could leave its root."""
    parts = path.split("/")
    if not path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        return None
    return parts


def parent_fd(root_fd: int, parts: list[str], *, make: bool = False) -> int | None:
    """The directory holding the last of `parts`, opened from root without following a link
    (None when a parent is missing or is not a directory: the entry is skipped); with `make`,
    missing parents are made (0700)."""
    fd = os.dup(root_fd)
    for part in parts[:-1]:
        try:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return fd


def load_entry(root_fd: int, entry: Entry, dirs: list[tuple[list[str], Entry]]) -> int | None:
    """Make one entry (a file: opened, returned, for its bytes); directories get their mode and
    time at the end (a read-only one would refuse its children). Raises OSError to skip it."""
    parts = parts_of(entry["d"])
    if parts is None:
        raise OSError("a path that leaves the root")
    fd = parent_fd(root_fd, parts)
    if fd is None:
        raise OSError("a parent that is missing or not a directory")
    name = parts[-1]
    mode = int(entry["m"]) & 0o3777 if entry["k"] == "dir" else int(entry["m"]) & 0o1777
    try:
        if entry["k"] == "dir":
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise
            dirs.append((parts, entry))
            return None
        if entry["k"] == "symlink":
            os.symlink(entry.get("l", ""), name, dir_fd=fd)
            ns = int(entry["mt"])
            os.utime(name, ns=(ns, ns), dir_fd=fd, follow_symlinks=False)
            return None
        if entry["k"] != "file":
            raise OSError("not kept here")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        file_fd = os.open(name, flags, 0o600, dir_fd=fd)
        os.fchmod(file_fd, mode)
        return file_fd
    finally:
        os.close(fd)


def finish_dirs(
    root_fd: int,
    dirs: list[tuple[list[str], Entry]],
    *,
    owners: bool = False,
    parents: Parents | None = None,
    exact: bool = False,
) -> None:
    """Directories' modes and times (with `owners`, owners too; no parts: the root itself),
    deepest first (setting a time on a parent before its children are done would be undone
    by them). `parents`: `place`'s, whose kept descriptors are reused (a sandbox's own
    claim, `load`'s root, is walked again from the root each time). A time of 0 is that of a
    directory the driver adds above a kept path (`load`), which keeps its own; with `exact`
    (the helper's own listing, `place`), 0 is the directory's time like any other."""
    for parts, entry in sorted(dirs, key=lambda d: -len(d[0])):
        if not parts:
            child = os.dup(root_fd)
        else:
            fd = parent_fd(root_fd, parts) if parents is None else parents.of(parts)
            if fd is None:
                continue
            try:
                child = os.open(parts[-1], NOFOLLOW_DIR, dir_fd=fd)
            except OSError:
                continue
            finally:
                if parents is None:
                    os.close(fd)
            if parents is not None:
                parents.opened += 1
        try:
            if owners:
                os.fchown(child, int(entry["u"]), int(entry["g"]))
            os.fchmod(child, int(entry["m"]) & 0o3777)
            ns = int(entry["mt"])
            if ns or exact:
                os.utime(child, ns=(ns, ns))
        finally:
            os.close(child)


def carriable(was: list[Any], laid: list[Any], *, owners: bool = True) -> bool:
    """Whether a file laid down (its signature `laid`) is the snapshot's (`was`) in all but
    the runtime's change marks (ctime, inode, between mtime and the link target); `owners`
    false: whatever its owner (Kubernetes gives every file to the sandbox's user)."""
    same = laid[:2] + laid[4:6] + laid[-2:] == was[:2] + was[4:6] + was[-2:]
    return same and (not owners or laid[2:4] == was[2:4])


def write_carried(root_fd: int, carried: dict[str, dict[str, list[Any]]]) -> None:
    """The record `carry` reads, CARRIED_NAME in the root, whole or not at all."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    part = CARRIED_NAME + ".part"
    fd = os.open(part, flags, 0o600, dir_fd=root_fd)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(carried, separators=(",", ":")))
    os.rename(part, CARRIED_NAME, src_dir_fd=root_fd, dst_dir_fd=root_fd)


def reuse(request: dict[str, Any]) -> None:
    """{"op": "reuse", "known_file": path ({"workspace": {path: signature}}: a snapshot's
    files as the sandbox it was taken of held them), "carried_file": path (optional: the record
    `carry` reads, of the base the old workspace stands on), "layers": [dirs] (the old
    workspace's directories: its volume's, or its overlay's upper and lower), "target": dir
    (the new base's lower/, empty)}: a rewind's files that the old workspace still holds, each
    hard-linked into "target" at its path (parents made 0700: the archive that follows sets
    them), so that only the others come out of the store; answered {"reused": [paths],
    "bytes": n}. A file is taken only when one at its path in some layer has exactly its
    signature (kind, mode, owner, size, mtime, ctime and inode): any write, chmod or rename
    since gives a new ctime, and a layer below an overlay is never written, so it is the
    snapshot's file whatever the overlay above now shows. Nothing is followed through a link,
    nor made outside "target"."""
    with open(request["known_file"]) as handle:
        known: dict[str, dict[str, list[Any]]] = json.loads(handle.read())
    if request.get("carried_file"):
        carry(known, request["carried_file"])
    with contextlib.suppress(FileExistsError):
        os.mkdir(request["target"], 0o700)
    target_fd = os.open(request["target"], NOFOLLOW_DIR)
    layers = []
    for layer in request["layers"]:
        with contextlib.suppress(OSError):  # a missing layer holds nothing
            layers.append(os.open(layer, NOFOLLOW_DIR))
    reused: list[str] = []
    size = 0
    for path, want in known.get("workspace", {}).items():
        parts = parts_of(path)
        if parts is None or want[0] != "file":
            continue
        found = held(layers, parts, want)
        if found is None:
            continue
        fd, name = found
        try:
            dst = parent_fd(target_fd, parts, make=True)
            if dst is None:
                continue
            try:
                os.link(name, parts[-1], src_dir_fd=fd, dst_dir_fd=dst, follow_symlinks=False)
            except OSError:
                continue
            finally:
                os.close(dst)
        finally:
            os.close(fd)
        reused.append(path)
        size += int(want[4])
    for fd in [target_fd, *layers]:
        os.close(fd)
    send_json(b"J", {"reused": reused, "bytes": size})
    out.flush()


def held(layers: list[int], parts: list[str], want: list[Any]) -> tuple[int, str] | None:
    """The directory (opened) and name of a file at `parts` in one of `layers` whose signature
    is `want`; None when no layer has it."""
    for layer in layers:
        fd = parent_fd(layer, parts)
        if fd is None:
            continue
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            entry = entry_of("workspace", "", st, fd, parts[-1], layer=False)
        except OSError:
            entry = None
        if entry is not None and signature(entry) == want:
            return fd, parts[-1]
        os.close(fd)
    return None


def load(request: dict[str, Any]) -> None:
    root_fd = os.open(request["root"], NOFOLLOW_DIR)
    dirs: list[tuple[list[str], Entry]] = []
    loaded = skipped = 0
    file_fd: int | None = None
    entry: Entry = {}
    carried: dict[str, dict[str, list[Any]]] = {}
    while True:
        kind, payload = read_frame()
        if kind == b"F":
            if file_fd is not None:
                os.write(file_fd, payload)
            continue
        if file_fd is not None:
            ns = int(entry["mt"])
            os.utime(file_fd, ns=(ns, ns))
            if entry.get("w"):  # its signature in the snapshot: carried when it is the same
                made = entry_of(entry["t"], entry["p"], os.fstat(file_fd), None, "", layer=False)
                laid = signature(made) if made is not None else None
                if laid is not None and carriable(entry["w"], laid, owners=False):
                    carried.setdefault(entry["t"], {})[entry["p"]] = [entry["w"], laid]
            os.close(file_fd)
            file_fd = None
        if kind == b"Z":
            break
        if kind != b"E":
            raise SystemExit(f"unexpected frame {kind!r}")
        entry = json.loads(payload)
        try:
            file_fd = load_entry(root_fd, entry, dirs)
            loaded += 1
        except OSError:
            skipped += 1
    finish_dirs(root_fd, dirs)
    if carried:
        write_carried(root_fd, carried)
    os.close(root_fd)
    counted = sum(len(paths) for paths in carried.values())
    send_json(b"J", {"loaded": loaded, "skipped": skipped, "carried": counted})
    out.flush()


def main() -> None:
    _, payload = read_frame()
    request = json.loads(payload)
    op = request.get("op")
    if op == "export":
        export(request)
    elif op == "load":
        load(request)
    elif op == "stamp":
        stamp(request)
    elif op == "reuse":
        reuse(request)
    else:
        raise SystemExit(f"unknown op {op!r}")


if __name__ == "__main__":
    main()
