"""Snapshots on Kubernetes (drivers/base.py: SandboxFiles): a sandbox's files read consistently
from its workspace claim, and a new sandbox's claim filled from a snapshot before its pod starts.

A snapshot on Kubernetes holds the workspace and the kept state paths, which live on the claim
(objects.py: `workspace/`, `state/<path>`); the container's writable layer lives in the node's
container runtime, out of the API's reach, so the system tree is always empty here (packages the
agent installed outside the workspace are not kept: docs/sandboxes.md).

Both directions run drivers/files_helper.py in a short-lived helper pod (objects.py:
helper_manifest) of the trusted helper image, as the sandbox's own uid, talked to through exec
(exec.py); the bytes travel through the API server to and from the control plane, which alone
speaks to the snapshot store.

- Export: the helper, on the running sandbox's node with the claim mounted read-only, copies
  what changed since the last snapshot to its scratch directory while the sandbox runs; then the
  sandbox's processes are stopped (`kill -STOP -1` through exec, as its own user: every process
  of the pod but its init), the helper looks again and copies only what changed meanwhile, and
  they are continued. The stopping shell continues them itself when its stream ends, and after
  HOLD_LIMIT seconds whatever happens, so a control plane that dies in between leaves no
  sandbox stopped. A paused sandbox (no pod) is read as it is.
- Import: a new claim is filled by a helper before the sandbox's pod is made: entries and bytes
  stream into its stdin; it writes nothing through a link, beneath anything but a directory, or
  outside the claim, and the driver checks every path before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import structlog

from drivers.base import (
    STATE,
    WORKSPACE,
    FileEntry,
    FileExport,
    FileItem,
    FileKind,
    Hold,
    LocalCopy,
    SandboxRequest,
)
from drivers.errors import DriverError, FilesTooLarge, RuntimeUnavailable
from drivers.helper_answers import SCRIPT, checked, known_by_tree, unchanged
from drivers.kubernetes.api import KubeApi, claims, pods
from drivers.kubernetes.exec import Exec, ExecFailed
from drivers.kubernetes.names import (
    ANNOTATION_RUN_AS,
    LABEL_FILES,
    claim_name,
    helper_name,
    label_value,
    pod_name,
)
from drivers.kubernetes.nodes import quantity
from drivers.kubernetes.objects import (
    CONTAINER,
    HELPER_CONTAINER,
    HELPER_DEADLINE,
    helper_manifest,
)
from drivers.kubernetes.settings import KubernetesSettings
from drivers.kubernetes.state import parse_time, terminating

log = structlog.get_logger(__name__)
Json = dict[str, Any]
CLAIM = "/acs/claim"
CARRIED = "carried.json"
"""At the claim's root (out of the sandbox's reach: it mounts workspace/ and state/): the
signatures of the files a restore laid down, beside theirs in the snapshot; an export compares
a known entry with them (drivers/files_helper.py: carry), so the first snapshot after a restore
reads only what changed since."""
HOLD_LIMIT = 30
"""Seconds after which a stopped sandbox continues on its own (the control plane died)."""
HOLD_SCRIPT = (
    "kill -STOP -1 2>/dev/null; "
    f"(sleep {HOLD_LIMIT}; kill -CONT -1) >/dev/null 2>&1 & "
    "echo held; read -r _; kill -CONT -1; kill $! 2>/dev/null; echo released"
)
"""Run as the sandbox's user in its container: stop every process it may signal (all of the
pod's but init and this shell), continue them when told, when the stream ends (`read` meets
its end) or after HOLD_LIMIT seconds."""
HOLD_ANSWER_WITHIN = 10.0
"""Seconds the stopping shell has to say it holds the sandbox (else the snapshot fails)."""
HELPER_ANSWER_WITHIN = 600.0
"""Seconds the helper has for each step of an export (a copy of up to the size limit): a
helper that hangs never keeps the sandbox's lock."""
STARTED_POLL = 0.1
POD_GONE_MARGIN = 30.0
"""Seconds past the pause's grace that an export waits for a paused sandbox's pod to go."""
PIECE = 1 << 20


def entry_from(raw: dict[str, Any], known: Mapping[tuple[str, str], FileEntry]) -> FileEntry:
    """An entry as files_helper.py lists it, checked: a tree of ours, a relative path that
    stays beneath its root, a known kind, sizes that make sense; an unchanged one is the
    caller's own (checked when it was listed)."""
    if raw.get("c") is False:
        return unchanged(known, raw)
    tree, path, kind = raw.get("t"), raw.get("p"), raw.get("k")
    if tree not in (WORKSPACE, STATE) or not isinstance(path, str) or not safe_path(path, tree):
        raise DriverError(f"the snapshot helper listed an entry it should not have: {raw!r:.200}")
    if kind not in ("file", "dir", "symlink"):
        raise DriverError(f"the snapshot helper listed an entry of kind {kind!r}")
    size = int(raw.get("s", 0))
    if size < 0:
        raise DriverError("the snapshot helper listed a negative size")
    return FileEntry(
        tree=tree,
        path=path,
        kind=FileKind(kind),
        mode=int(raw["m"]) & 0o7777,
        uid=int(raw["u"]),
        gid=int(raw["g"]),
        size=size,
        mtime_ns=int(raw["mt"]),
        target=str(raw.get("l", "")),
        stamp=(int(raw["ct"]), int(raw["i"])),
        changed=bool(raw.get("c", True)),
    )


def safe_path(path: str, tree: str) -> bool:
    """A path that names something beneath its tree's root ("" is the workspace's root)."""
    if path == "":
        return tree == WORKSPACE
    parts = path.split("/")
    return "\0" not in path and not any(part in ("", ".", "..") for part in parts)


class KubeFiles:
    """The snapshot capability of one deployment (`prefix`) in the sandbox namespace; `image`:
    the helper image (ACS_SNAPSHOT_HELPER_IMAGE)."""

    keeps_system = False  # the container's writable layer is the node runtime's

    def __init__(
        self, api: KubeApi, settings: KubernetesSettings, *, prefix: str, image: str
    ) -> None:
        self._api = api
        self._settings = settings
        self._prefix = prefix
        self._image = image
        self._ns = settings.kube_namespace
        self._closing: set[asyncio.Task[None]] = set()
        self._in_use: set[str] = set()

    # -- export ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def export(
        self,
        sandbox_id: str,
        known: Mapping[tuple[str, str], FileEntry],
        *,
        working_dir: str,
        state_paths: Sequence[str],
        hold: Hold,
        max_bytes: int | None = None,
        local: LocalCopy | None = None,  # no shared copy here (builds_locally is False)
    ) -> AsyncIterator[FileExport]:
        pod = await self._api.get(pods(self._ns, pod_name(self._prefix, sandbox_id)), "inspect")
        if pod is not None and terminating(pod):
            pod = await self._stopped(sandbox_id)
        claim = await self._api.get(
            claims(self._ns, claim_name(self._prefix, sandbox_id)), "inspect"
        )
        if claim is None or terminating(claim):
            raise DriverError(f"sandbox {sandbox_id} has no workspace claim: nothing to read")
        running = pod is not None and _running(pod)
        if pod is not None and not running and not terminating(pod):
            raise DriverError(f"sandbox {sandbox_id}'s pod is starting: retry once it runs")
        # On the pod's node while it exists (a volume that attaches to one node at a time).
        node = str((pod or {}).get("spec", {}).get("nodeName") or "") or None
        run_as = _run_as(claim, pod)
        by_tree = known_by_tree(known)
        async with self._helper(sandbox_id, run_as, node=node, read_only=True) as helper:
            request = {
                "op": "export",
                "known": by_tree,
                "roots": {"ws": f"{CLAIM}/workspace", "upper": f"{CLAIM}/state"},
                "carried_file": f"{CLAIM}/{CARRIED}",
                "staging": "/acs/work/staging",
                "system": False,
                "stream": True,
                "state": [p.strip("/") for p in state_paths],
                "skip": [],
                "precopy": running,
                "max_bytes": max_bytes or 0,
                "scratch_bytes": int(quantity(self._settings.kube_snapshot_scratch_size)),
            }
            ready = _checked(await asyncio.wait_for(helper.ask(request), HELPER_ANSWER_WITHIN))
            log.debug("kube_snapshot_helper_ready", sandbox_id=sandbox_id, **ready)
            if running:
                held = await self._still(sandbox_id, helper, hold)
            else:
                _checked(await asyncio.wait_for(helper.ask({"op": "go"}), HELPER_ANSWER_WITHIN))
                held = 0.0
            yield FileExport(held_still=held, items=self._items(helper, known, max_bytes))

    async def _stopped(self, sandbox_id: str) -> Json | None:
        """A paused sandbox's pod still stopping (its processes may still write): waited for
        until its containers have all ended (the pod object itself may stay a while longer,
        its volumes being torn down), for the pause's grace and a margin; the pod then, None
        once gone, or a new one (the sandbox was resumed meanwhile)."""
        path = pods(self._ns, pod_name(self._prefix, sandbox_id))
        deadline = time.monotonic() + self._settings.kube_pause_grace + POD_GONE_MARGIN
        pod: Json | None = None
        while time.monotonic() < deadline:
            pod = await self._api.get(path, "inspect")
            if pod is None or not terminating(pod) or _ended(pod):
                return pod
            await asyncio.sleep(STARTED_POLL * 2)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        states = [c.get("state") for c in statuses]
        log.warning("kube_snapshot_pod_still_stopping", sandbox_id=sandbox_id, states=states)
        raise DriverError(f"sandbox {sandbox_id}'s pod is still stopping: retry in a moment")

    async def _still(self, sandbox_id: str, helper: Exec, hold: Hold) -> float:
        """Stop the sandbox's processes for the helper's second look; the seconds they were
        stopped. They are continued whatever happens (also by the stopping shell itself)."""
        await hold.begin()
        try:
            started = time.monotonic()
            stopper = await Exec.open(
                self._api,
                self._ns,
                pod_name(self._prefix, sandbox_id),
                CONTAINER,
                ["sh", "-c", HOLD_SCRIPT],
                what=f"holding sandbox {sandbox_id} still",
            )
            try:
                # Bounded: the agent's own processes may stop the stopping shell before it
                # answers (a loop of `kill -STOP -1`), and the hold keeps the sandbox's lock.
                try:
                    said = await asyncio.wait_for(stopper.line(), HOLD_ANSWER_WITHIN)
                except TimeoutError:
                    said = ""
                if said != "held":
                    raise DriverError(f"sandbox {sandbox_id} could not be held still")
                _checked(await asyncio.wait_for(helper.ask({"op": "go"}), HELPER_ANSWER_WITHIN))
                await stopper.write(b"go\n")
                with contextlib.suppress(ExecFailed, TimeoutError):
                    await asyncio.wait_for(stopper.line(), 5)
            finally:
                await stopper.close()
            held = time.monotonic() - started
        finally:
            await hold.end()
        return held

    async def _items(
        self, helper: Exec, known: Mapping[tuple[str, str], FileEntry], max_bytes: int | None
    ) -> AsyncIterator[FileItem]:
        """The listing, then each changed file's bytes after its entry, exactly its size."""
        kind, payload = await helper.read()
        if kind != b"L":
            raise DriverError(f"the snapshot helper sent {kind!r} instead of its listing")
        listing = [entry_from(raw, known) for raw in json.loads(payload)]
        total = 0
        for entry in listing:
            yield entry
            if entry.kind != FileKind.FILE or not entry.changed:
                continue
            total += entry.size
            if max_bytes and total > max_bytes:
                raise FilesTooLarge(f"the sandbox's changed files are over {max_bytes} bytes")
            left = entry.size
            while left > 0:
                kind, piece = await helper.read()
                if kind != b"F" or len(piece) > left:
                    raise DriverError(f"the bytes of {entry.path!r} are not the ones announced")
                left -= len(piece)
                yield piece
        kind, _ = await helper.read()
        if kind != b"Z":
            raise DriverError("the snapshot helper sent more than it listed")

    # -- import ---------------------------------------------------------------------------------

    async def fill(self, request: SandboxRequest) -> None:
        """Write `request.restore`'s workspace (and state, when it gives it) into the sandbox's
        new claim, before its pod is made. Raises DriverError, RuntimeUnavailable, or what the
        source raises."""
        source = request.restore
        assert source is not None
        run_as = _ids(request.user)
        if run_as is None:
            raise DriverError("a sandbox made from a snapshot needs a spec with a numeric user")
        async with self._helper(request.sandbox_id, run_as, node=None, read_only=False) as helper:
            await helper.send_json({"op": "load", "root": CLAIM})
            sent = await send_items(helper.write, source.items())
            answer = await helper.read_json()
        log.info(
            "kube_snapshot_restored",
            sandbox_id=request.sandbox_id,
            snapshot=source.key,
            sent=sent,
            loaded=answer.get("loaded"),
            skipped=answer.get("skipped"),
            carried=answer.get("carried"),
        )

    # -- helpers --------------------------------------------------------------------------------

    @asynccontextmanager
    async def _helper(
        self, sandbox_id: str, run_as: tuple[int, int], *, node: str | None, read_only: bool
    ) -> AsyncIterator[Exec]:
        """A helper pod on the claim of `sandbox_id`, running, and files_helper.py started in
        it; the pod is deleted after, whatever happened (in the background: nothing waits)."""
        name = helper_name(self._prefix, secrets.token_hex(6))
        manifest = helper_manifest(
            name,
            claim_name(self._prefix, sandbox_id),
            self._settings,
            self._prefix,
            image=self._image,
            run_as=run_as,
            node=node,
            read_only=read_only,
        )
        if await self._api.create(pods(self._ns), manifest, "snapshot") is None:
            raise DriverError(f"snapshot helper {name} exists already")
        helper: Exec | None = None
        self._in_use.add(name)
        try:
            await self._started(name)
            helper = await Exec.open(
                self._api,
                self._ns,
                name,
                HELPER_CONTAINER,
                ["python3", "-I", "-S", "-c", SCRIPT],
                what="the snapshot helper",
            )
            yield helper
        finally:
            task = asyncio.create_task(self._remove(name, helper))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _remove(self, name: str, helper: Exec | None) -> None:
        if helper is not None:
            await helper.close()
        try:
            await self._api.delete(pods(self._ns, name), "snapshot", grace=0)
        except (DriverError, RuntimeUnavailable) as exc:
            log.warning("kube_snapshot_helper_left", pod=name, error=str(exc))  # the sweep's
        finally:
            self._in_use.discard(name)

    async def _started(self, name: str) -> None:
        """Wait until the helper pod runs. Raises DriverError when it fails or takes longer
        than a sandbox's pod may (ACS_KUBE_POD_START_TIMEOUT)."""
        deadline = time.monotonic() + self._settings.kube_pod_start_timeout
        path = pods(self._ns, name)
        while True:
            pod = await self._api.get(path, "snapshot")
            status = (pod or {}).get("status") or {}
            if status.get("phase") == "Running":
                return
            if pod is None or status.get("phase") in ("Failed", "Succeeded"):
                raise DriverError(f"snapshot helper {name} did not start: {_why(status)}")
            waiting = _waiting(status)
            if waiting in ("ErrImageNeverPull", "InvalidImageName", "ImagePullBackOff"):
                raise DriverError(
                    f"snapshot helper {name} cannot start ({waiting}): the helper image "
                    f"{self._image} (ACS_SNAPSHOT_HELPER_IMAGE) must be on the nodes or pullable"
                )
            if time.monotonic() > deadline:
                raise DriverError(f"snapshot helper {name} did not start in time: {_why(status)}")
            await asyncio.sleep(STARTED_POLL)

    builds_locally = False  # each restore fills its own claim out of the store

    async def build_local(
        self,
        key: str,
        image: str,
        items: AsyncIterator[FileItem],
        sandbox_ids: Sequence[str] = (),
        ready: Callable[[], None] | None = None,
    ) -> None:
        raise DriverError("the Kubernetes runtime keeps no shared copy of a snapshot's files")

    async def forget(self, key: str) -> None:
        """Nothing is kept of a snapshot on the cluster: each restore fills its own claim."""

    async def sweep(self, older_than: float) -> int:
        """Helper pods that ended (their `activeDeadlineSeconds` ended one whose control plane
        died) more than `older_than` seconds after they were made, and any past that deadline.
        A running helper may be another replica's, at work: it is left alone until then."""
        listed = await self._api.list(
            pods(self._ns), f"{LABEL_FILES}={label_value(self._prefix)}", "snapshot"
        )
        now = time.time()
        removed = 0
        for pod in listed.get("items") or []:
            metadata = pod.get("metadata") or {}
            name = str(metadata.get("name"))
            made = parse_time(metadata.get("creationTimestamp"))
            if name in self._in_use or made is None:
                continue
            age = now - made.timestamp()
            ended = ((pod.get("status") or {}).get("phase")) in ("Failed", "Succeeded")
            if not ((ended and age > older_than) or age > HELPER_DEADLINE + older_than):
                continue
            if await self._api.delete(pods(self._ns, name), "snapshot", grace=0):
                removed += 1
        return removed

    async def close(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _checked(answer: Json) -> Json:
    """The helper's answer, unless it refused the export (helper_answers.py)."""
    return checked(answer, scratch_setting="ACS_KUBE_SNAPSHOT_SCRATCH_SIZE")


def _running(pod: Json) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and not terminating(pod)


def _ended(pod: Json) -> bool:
    """No container of the terminating pod runs, and none will: restartPolicy Never, and the
    kubelet starts nothing in a pod being deleted. A container is `terminated`, or `waiting`:
    the state the kubelet reports for one it no longer finds once it has removed it (reason
    "ContainerCreating", seen in CI while the pod object lingered for over a minute)."""
    status = pod.get("status") or {}
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    return bool(statuses) and all("running" not in (c.get("state") or {}) for c in statuses)


def _ids(user: str | None) -> tuple[int, int] | None:
    if user is None:
        return None
    uid, _, gid = user.partition(":")
    if not (uid.isascii() and uid.isdigit()) or (gid and not (gid.isascii() and gid.isdigit())):
        return None
    return int(uid), int(gid or uid)


def _run_as(claim: Json, pod: Json | None) -> tuple[int, int]:
    """The uid and gid the sandbox runs as: its claim says (made since snapshots came), else its
    pod's security context."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    found = _ids(annotations.get(ANNOTATION_RUN_AS))
    if found is not None:
        return found
    context = ((pod or {}).get("spec") or {}).get("securityContext") or {}
    if isinstance(context.get("runAsUser"), int):
        uid = int(context["runAsUser"])
        return uid, int(context.get("runAsGroup") or uid)
    raise DriverError("the sandbox's claim does not say which user it runs as: resume it first")


async def send_items(
    write: Callable[[bytes], Awaitable[None]], items: AsyncIterator[FileItem]
) -> int:
    """Every entry of the workspace and state trees whose path is sound, with its bytes;
    nothing beneath an entry that is not a directory (a link the agent made where a
    directory was must never carry what was beneath it). The count of entries sent."""
    leaves: set[tuple[str, str]] = set()
    dirs: set[str] = set()
    keep = False
    sent = 0
    buffer = bytearray()
    async for item in items:
        if isinstance(item, bytes):
            if keep:
                buffer += _frame(b"F", item)
                if len(buffer) >= PIECE:  # a file's bytes never pile up whole here
                    await write(bytes(buffer))
                    buffer.clear()
            continue
        keep = _loadable(item, leaves)
        if not keep:
            continue
        where = "workspace" if item.tree == WORKSPACE else "state"
        destination = f"{where}/{item.path}".rstrip("/")
        # The directories above a kept path are not in a snapshot (only what lies under
        # it is): made plain, before it.
        parts = destination.split("/")
        for n in range(1, len(parts)):
            parent = "/".join(parts[:n])
            if parent not in dirs:
                dirs.add(parent)
                buffer += _frame(b"E", _entry_json(_PARENT, parent))
        if item.kind == FileKind.DIR:
            dirs.add(destination)
        buffer += _frame(b"E", _entry_json(item, destination))
        sent += 1
        if len(buffer) >= PIECE:
            await write(bytes(buffer))
            buffer.clear()
    buffer += _frame(b"Z", b"")
    await write(bytes(buffer))
    return sent


def _loadable(entry: FileEntry, leaves: set[tuple[str, str]]) -> bool:
    """Whether to send `entry` to the loader (and remember it when it is not a directory)."""
    if entry.tree not in (WORKSPACE, STATE) or not safe_path(entry.path, entry.tree):
        return False
    if entry.kind not in (FileKind.FILE, FileKind.DIR, FileKind.SYMLINK):
        return False
    if entry.path == "" and entry.kind != FileKind.DIR:  # a tree's root is a directory, ever
        return False
    parts = entry.path.split("/")
    if any((entry.tree, "/".join(parts[:n])) in leaves for n in range(1, len(parts))):
        return False
    if entry.kind != FileKind.DIR:
        leaves.add((entry.tree, entry.path))
    return True


_PARENT = FileEntry(STATE, "", FileKind.DIR, 0o755, mtime_ns=0)
"""A directory above a kept path (its mtime: the loader's own, 0 reads as "now")."""


def _entry_json(entry: FileEntry, destination: str) -> bytes:
    raw: dict[str, Any] = {
        "d": destination,
        "k": entry.kind.value,
        "m": entry.mode,
        "mt": entry.mtime_ns,
    }
    if entry.kind == FileKind.SYMLINK:
        raw["l"] = entry.target
    if entry.kind == FileKind.FILE:  # what the loader records for the first export after it
        raw.update(t=entry.tree, p=entry.path, w=list(entry.signature()))
    return json.dumps(raw, separators=(",", ":")).encode()


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def _waiting(status: Json) -> str:
    for container in status.get("containerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return str(reason)
    return ""


def _why(status: Json) -> str:
    return _waiting(status) or str(status.get("reason") or status.get("phase") or "no status")
