"""Snapshots on Docker (drivers/base.py: SandboxFiles): a sandbox's files read consistently, and
new sandboxes made from a snapshot's files (drivers/docker/bases.py).

An export runs drivers/files_helper.py in a helper container that mounts the sandbox's
workspace volume and its container's writable layer (overlay2's "upper" directory: what changed
outside the workspace, whiteouts included), both read-only. While the sandbox still runs the
helper copies what changed since the last snapshot to a staging directory of its own; then the
sandbox is frozen (`docker pause`, the cgroup freezer: freezer.py), the helper looks again and
copies only what changed meanwhile, and the sandbox is thawed: it is held still for one scan of
its trees and those few files. The staged files stream to the control plane after the thaw.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tarfile
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import IO, Any, TypeVar

import docker
import structlog
from docker.errors import APIError, DockerException, NotFound
from docker.types import Mount
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from drivers.base import (
    FileEntry,
    FileExport,
    FileItem,
    FileKind,
    Hold,
)
from drivers.docker import names as docker_names
from drivers.docker.engine import DockerEngine
from drivers.docker.freezer import freeze
from drivers.docker.helper import CAPABILITIES, STAGE_CAPABILITIES, Helper
from drivers.errors import DriverError, RuntimeUnavailable
from drivers.helper_answers import checked, known_by_tree, unchanged

T = TypeVar("T")
log = structlog.get_logger(__name__)
LABEL_SNAPSHOT = "acs.snapshot"
"""On a base image (and so on the containers that run it): the snapshot whose files it holds
(drivers/docker/bases.py)."""
BATCH_BYTES = 8 << 20
"""What one read from the helper collects before handing it to the event loop (a file larger
than that is handed over in several)."""
PIECE = 1 << 20
CARRIED = "carried.json"
"""In a base volume, beside lower/: its files' signatures as laid down, carried into the first
export of a sandbox made from it (files_helper.py: carry)."""
READY = "/acs/ready"  # files_helper.py's
INTO = "/acs/into"
"""Where a fork's export mounts the new base volume: its copies are staged there
(`DockerExports.export`'s `into`)."""
SYSTEM_INTO = "/acs/into-system"
"""Where a fork's export mounts the writable layer its base's image is committed from: the
helper lays the system tree down there (`Staging.system`)."""
LISTING = "-listing.json"  # files_helper.py's
KNOWN = "acs-known.json"


class Staging:
    """A fork's new base volume that its export stages its copies in (bases.py:
    `DockerBases.prepare`): what the export's helper said of the workspace it laid down there
    (`placed`: its answer, or the error that stopped it), and whether the helper, which holds
    the volume, is removed (`released`: the volume can go only after)."""

    def __init__(self, volume: str, system: str = "", forks: Sequence[str] = ()) -> None:
        """`system`: the host path of the (empty) writable layer of the container the base's
        image is committed from, where the helper lays the system tree down too, and `forks`
        the sandboxes whose directories it makes in the base: the base is then whole when the
        helper answers (at the export's end), not when the engine's stream of the copies
        ends (bases.py: `DockerBases.prepare`)."""
        loop = asyncio.get_running_loop()
        self.volume = volume
        self.system = system
        self.forks = list(forks)
        self.placed: asyncio.Future[dict[str, Any] | Exception] = loop.create_future()
        self.released: asyncio.Future[None] = loop.create_future()

    def tell(self, answer: dict[str, Any] | Exception) -> None:
        if not self.placed.done():
            self.placed.set_result(answer)

    def release(self) -> None:
        # The helper is gone: whoever waits for its word (a build) hears that it never came.
        self.tell(DriverError("the export's helper went without saying how it laid the base"))
        if not self.released.done():
            self.released.set_result(None)


def entry_from(raw: dict[str, Any], known: Mapping[tuple[str, str], FileEntry]) -> FileEntry:
    """An entry as files_helper.py describes it (an unchanged one: the caller's own)."""
    if raw.get("c") is False:
        return unchanged(known, raw)
    return FileEntry(
        tree=raw["t"],
        path=raw["p"],
        kind=FileKind(raw["k"]),
        mode=raw["m"],
        uid=raw["u"],
        gid=raw["g"],
        size=raw["s"],
        mtime_ns=raw["mt"],
        target=raw.get("l", ""),
        opaque=bool(raw.get("o", False)),
        stamp=(raw["ct"], raw["i"]),
        changed=bool(raw.get("c", True)),
        name=raw.get("n", ""),
    )


def entry_json(entry: FileEntry) -> bytes:
    """An entry as files_helper.py reads it."""
    raw: dict[str, Any] = {
        "t": entry.tree,
        "p": entry.path,
        "k": entry.kind.value,
        "m": entry.mode,
        "u": entry.uid,
        "g": entry.gid,
        "mt": entry.mtime_ns,
    }
    if entry.target:
        raw["l"] = entry.target
    if entry.opaque:
        raw["o"] = True
    return json.dumps(raw).encode()


class _Staged:
    """The helper's staged copies (/acs/ready), as the engine streams them in one tar archive
    (GET /containers/{id}/archive): sorted by name, which is the listing's order. Blocking."""

    def __init__(self, client: docker.DockerClient, container_id: str, ready: str) -> None:
        stream, _ = client.api.get_archive(container_id, ready, chunk_size=PIECE)
        self._stream = stream
        self._tar = tarfile.open(  # noqa: SIM115 (closed by close())
            fileobj=_Chunks(stream), mode="r|", bufsize=PIECE
        )
        self._members = iter(self._tar)

    def listing(self, known: Mapping[tuple[str, str], FileEntry]) -> list[FileEntry]:
        """The export's entries (the archive's first file)."""
        for member in self._members:
            if member.isfile():
                if member.name.rsplit("/", 1)[-1] != LISTING:
                    raise DriverError("the helper's archive does not begin with its listing")
                handle = self._tar.extractfile(member)
                assert handle is not None
                return [entry_from(raw, known) for raw in json.loads(handle.read())]
        raise DriverError("the helper's archive has no listing")

    def open(self, entry: FileEntry) -> IO[bytes]:
        """The next staged file, which must be `entry`'s, to be read in pieces (a large file
        is never held whole); valid until the next call."""
        for member in self._members:
            if not member.isfile():
                continue
            if member.name.rsplit("/", 1)[-1] != entry.name or member.size != entry.size:
                raise DriverError(f"the staged copy of {entry.path!r} is not the one announced")
            handle = self._tar.extractfile(member)
            assert handle is not None
            return handle
        raise DriverError(f"the staged copy of {entry.path!r} is missing")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._tar.close()
        with contextlib.suppress(Exception):
            self._stream.close()


class _Chunks(io.RawIOBase):
    """A file over an iterator of byte chunks (the engine's response), read without copying
    what is left of a chunk at each read (tarfile reads in small records)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = memoryview(b"")
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at >= len(self._chunk):
            try:
                self._chunk, self._at = memoryview(next(self._chunks)), 0
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._chunk) - self._at)
        buffer[:size] = self._chunk[self._at : self._at + size]
        self._at += size
        return size


def _relative(path: str) -> str:
    return path.strip("/")


class Lane:
    """A thread pool of its own for the helpers' conversations, which hold a thread for as
    long as files stream (the engine's lanes stay free for the sandboxes' calls)."""

    def __init__(self, engine: DockerEngine, threads: int) -> None:
        self.engine = engine
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="docker-files")

    async def run(self, fn: Callable[[docker.DockerClient], T]) -> T:
        return await self.start(fn)

    def start(self, fn: Callable[[docker.DockerClient], T]) -> asyncio.Future[T]:
        """`fn` handed to a thread at once (the caller goes on meanwhile): its future."""
        loop = asyncio.get_running_loop()

        def call() -> T:
            try:
                return fn(self.engine.client())
            except (RequestsConnectionError, ReadTimeout) as exc:
                raise RuntimeUnavailable(f"Docker engine unreachable: {exc}") from None
            except DockerException as exc:
                if isinstance(exc, APIError):
                    raise DriverError(f"Docker error: {exc.explanation or exc}") from None
                raise RuntimeUnavailable(f"Docker engine unreachable: {exc}") from None

        return loop.run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class DockerExports:
    """The export half of the snapshot capability on one engine."""

    def __init__(
        self,
        lane: Lane,
        *,
        prefix: str,
        image: str,
        stamped_base: Callable[[str], Awaitable[str | None]] | None = None,
    ) -> None:
        """`stamped_base(workspace volume)`: the base it stands on once the base's record of
        its files is written (bases.py: DockerBases.stamped_base); without it no export
        compares with a base's record."""
        self._lane = lane
        self._stamped_base = stamped_base
        self._engine = lane.engine
        self._prefix = prefix
        self._image = image
        self._closing: set[asyncio.Task[None]] = set()

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
        into: Staging | None = None,
    ) -> AsyncIterator[FileExport]:
        """`into`: a fork's new base volume (empty), where the helper stages its copies and,
        while the engine streams them, lays the workspace tree down (its files hard links of
        the copies: bases.py, `DockerBases.prepare`); told to `into.placed`, and
        `into.released` set once the helper (which holds the volume) is removed."""
        try:
            name = docker_names.container_name(self._prefix, sandbox_id)
            attrs = await self._inspect(name)
            mounts = self._mounts(attrs, name, working_dir)
            carried = await self._carried(mounts)
            if into is not None:
                mounts.append(Mount(INTO, into.volume, type="volume"))
                if into.system:
                    mounts.append(Mount(SYSTEM_INTO, into.system, type="bind"))
            state = attrs.get("State") or {}
            running = bool(state.get("Running")) and not state.get("Paused")
            starting = self._lane.start(
                lambda c: Helper.start(
                    c,
                    image=self._image,
                    prefix=self._prefix,
                    sandbox_id=sandbox_id,
                    mounts=mounts,
                    capabilities=CAPABILITIES if into is None else STAGE_CAPABILITIES,
                )
            )
            # What the export knows, written while the engine makes and starts the helper
            # (which waits for its request before it reads the file). Nothing known (a first
            # snapshot, a fork's, which reads every file): no file, and no engine call to put
            # one there.
            known_file = {KNOWN: json.dumps(known_by_tree(known), separators=(",", ":")).encode()}
            helper = await starting
        except BaseException:
            if into is not None:
                into.release()
            raise
        ready = READY if into is None else f"{INTO}/ready"
        items: AsyncGenerator[FileItem] | None = None
        try:
            request: dict[str, Any] = {"op": "export", "known": {}}
            if known:
                await self._lane.run(lambda c: helper.put_files(known_file))
                request = {"op": "export", "known_file": f"/tmp/{KNOWN}"}  # noqa: S108 (its own)
            request |= {
                "state": [_relative(p) for p in state_paths],
                "skip": [_relative(working_dir)],
                "precopy": running,
                "max_bytes": max_bytes or 0,
            }
            if carried:
                request["carried_file"] = f"/acs/carried/{CARRIED}"
            if into is not None:
                request |= {"staging": f"{INTO}/staging", "ready": ready, "place": f"{INTO}/lower"}
                if into.system:
                    request |= {"place_system": SYSTEM_INTO, "forks": into.forks}
            answer = checked(await self._lane.run(lambda _: helper.ask(request)))
            log.debug("snapshot_helper_ready", **answer)
            held = (
                await self._still(name, helper, hold) if running else await self._go(name, helper)
            )
            items = self._items(helper, known, ready, into)
            yield FileExport(held_still=held, items=items)
        finally:
            if items is not None:
                # A caller that stopped reading (its writer failed) leaves the generator
                # suspended: closed here, so that the engine's archive of the copies (which
                # holds the helper's mounts) is closed before the helper goes.
                with contextlib.suppress(RuntimeError):  # it runs still: it ends by itself
                    await items.aclose()
            # Its work is done (or abandoned): removed without holding the caller up; a removal
            # that never happens (the control plane dying) is left to the sweep.
            task = asyncio.create_task(self._lane.run(lambda _: helper.close()))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            if into is not None:
                task.add_done_callback(lambda _: into.release())

    async def _go(self, name: str, helper: Helper) -> float:
        done = checked(await self._lane.run(lambda _: helper.ask({"op": "go"})))
        log.debug("snapshot_helper_done", **done)
        if done.get("skipped"):  # both looks': a fifo swapped in while the sandbox ran
            log.warning("snapshot_files_not_regular", container=name, paths=done["skipped"])
        return 0.0

    async def _still(self, name: str, helper: Helper, hold: Hold) -> float:
        """Freeze the container for the helper's second look; the seconds it was frozen. The
        container is thawed whatever happens (`hold` keeps the record of the moment in between,
        for a control plane that dies inside it)."""
        try:
            # Inside: a cancel that lands while the mark is being written still clears it.
            await hold.begin()
            started = time.monotonic()
            freezing = asyncio.ensure_future(freeze(self._engine, name))
            try:
                froze = await asyncio.shield(freezing)
            except asyncio.CancelledError:
                # Given up while the engine freezes it (a checkpoint that took too long): that
                # freeze still lands, so wait for it and undo it before the cancel goes on.
                await asyncio.wait({freezing})
                if not freezing.cancelled() and freezing.exception() is None and freezing.result():
                    await self._thaw(name)
                raise
            try:
                await self._go(name, helper)
            finally:
                if froze:
                    await self._thaw(name)
            held = time.monotonic() - started
        finally:
            await hold.end()
        return held

    async def _thaw(self, name: str) -> None:
        """`docker unpause`, carried to its end even when the export is cancelled meanwhile:
        whoever waits for the cancelled export then meets a sandbox that runs."""
        thawing = asyncio.ensure_future(self._engine.call(lambda c: c.api.unpause(name), "unpause"))
        try:
            await asyncio.shield(thawing)
        except asyncio.CancelledError:
            await asyncio.wait({thawing})
            raise

    async def _items(
        self,
        helper: Helper,
        known: Mapping[tuple[str, str], FileEntry],
        ready: str,
        into: Staging | None,
    ) -> AsyncGenerator[FileItem]:
        """The listing, then each changed file's bytes after its entry: all from the archive of
        the helper's `ready` directory, which the engine streams (the listing first). With
        `into`, the stream ends once the helper has said how it laid the workspace down in the
        base volume and has removed its copies there (`_placed`)."""
        await self._lane.run(lambda _: list(helper.frames()))  # until the helper's Z
        # The helper's word on what it laid down in the base comes while the engine streams
        # the copies: heard then, and told at once (the base can be finished before the
        # stream's end).
        hearing = None if into is None else self._hear(helper, into)
        archive: _Staged | None = None
        staged: Iterator[FileEntry] = iter(())
        reading: IO[bytes] | None = None  # the file whose pieces come next, across batches

        def batch(client: docker.DockerClient) -> list[FileItem]:
            nonlocal archive, staged, reading
            if archive is None:
                archive = _Staged(client, helper.container_id, ready)
                staged = iter(archive.listing(known))
            items: list[FileItem] = []
            size = 0
            while size < BATCH_BYTES:
                if reading is not None:
                    piece = reading.read(PIECE)
                    if piece:
                        items.append(piece)
                        size += len(piece)
                        continue
                    reading = None
                entry = next(staged, None)
                if entry is None:
                    break
                items.append(entry)
                size += 128
                if entry.kind == FileKind.FILE and entry.changed:
                    reading = archive.open(entry)
            return items

        # One batch read ahead: the engine's stream is read in the lane's thread while the
        # caller (the writer: chunk ids, seals) works through the batch before it, instead of
        # the two taking turns. Batches are read one at a time, in order (the archive is one
        # stream): the next starts only once the one ahead has landed.
        ahead: asyncio.Future[list[FileItem]] | None = self._lane.start(batch)
        try:
            while ahead is not None:
                items = await ahead
                ahead = self._lane.start(batch) if items else None
                for item in items:
                    yield item
            await self._placed(helper, hearing)
        finally:
            # Left early: the read ahead lands before the archive closes, and the helper's
            # answer (or its end) is waited for, so that its conversation is not read by two
            # threads (the helper goes right after).
            waits = [f for f in (ahead, hearing) if f is not None and not f.done()]
            await asyncio.gather(*waits, return_exceptions=True)
            if archive is not None:
                await self._lane.run(lambda _: archive.close() if archive else None)

    def _hear(self, helper: Helper, into: Staging) -> asyncio.Future[dict[str, Any]]:
        """The helper's word on the workspace (and system tree, and forks' directories) it
        lays down in the base volume, read in the lane while the engine streams its copies;
        told to `into.placed` as soon as it comes, whatever it is (a failure costs the base,
        never the snapshot)."""
        hearing = self._lane.start(lambda _: helper.read_json())

        def heard(done: asyncio.Future[dict[str, Any]]) -> None:
            if done.cancelled():
                into.tell(DriverError("the staged workspace was not laid down: cancelled"))
            elif done.exception() is not None:
                into.tell(
                    DriverError(f"the staged workspace was not laid down: {done.exception()}")
                )
            else:
                into.tell(done.result())

        hearing.add_done_callback(heard)
        return hearing

    async def _placed(self, helper: Helper, hearing: asyncio.Future[dict[str, Any]] | None) -> None:
        """Once the engine has read the helper's copies (the whole archive) and the helper
        said how it laid the base down (`_hear`), its copies removed: the count told to the
        staging's answer. No `hearing`: nothing to hear."""
        if hearing is None:
            return
        try:
            placed = await hearing
            cleaned = await self._lane.run(lambda _: helper.ask({"op": "clean"}))
            placed["cleaned"] = cleaned.get("cleaned")
        except Exception as exc:  # told already (`_hear`), or the clean: the sweep's then
            log.warning("snapshot_staging_not_cleaned", error=str(exc))

    async def _inspect(self, name: str) -> dict[str, Any]:
        def run(client: docker.DockerClient) -> dict[str, Any]:
            try:
                attrs: dict[str, Any] = client.api.inspect_container(name)
            except NotFound:
                raise DriverError(
                    f"sandbox container {name} does not exist: nothing to read"
                ) from None
            return attrs

        return await self._engine.call(run, "inspect")

    async def _carried(self, mounts: list[Mount]) -> bool:
        """For a sandbox made from a snapshot: its base volume, where the signatures of the
        files as laid down are (CARRIED), mounted read-only at /acs/carried. False for any
        other sandbox."""
        if self._stamped_base is None or not any(m["Target"] == "/acs/base" for m in mounts):
            return False
        volume = next(m["Source"] for m in mounts if m["Target"] == "/acs/ws")
        base = await self._stamped_base(volume)
        if not base:
            return False
        mounts.append(Mount("/acs/carried", base, type="volume", read_only=True))
        return True

    @staticmethod
    def _mounts(attrs: dict[str, Any], name: str, working_dir: str) -> list[Mount]:
        driver = attrs.get("GraphDriver") or {}
        upper = (driver.get("Data") or {}).get("UpperDir")
        if driver.get("Name") != "overlay2" or not upper:
            raise DriverError(
                f"the engine's storage driver is {driver.get('Name')!r}: snapshots need overlay2"
            )
        volume = next(
            (
                m.get("Name")
                for m in attrs.get("Mounts") or []
                if m.get("Destination") == working_dir and m.get("Type") == "volume"
            ),
            None,
        )
        if not volume:
            raise DriverError(f"sandbox container {name} has no workspace volume")
        mounts = [
            Mount("/acs/ws", volume, type="volume", read_only=True),
            Mount("/acs/upper", upper, type="bind", read_only=True),
        ]
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_SNAPSHOT):
            # Made from a snapshot: its image's top layer (below the engine's init layer) is
            # the snapshot's system tree, which the export merges under the container's own.
            lower = str((driver.get("Data") or {}).get("LowerDir") or "").split(":")
            if len(lower) < 2 or not lower[0].endswith("-init/diff"):
                raise DriverError(f"cannot find the base layer of {name}")
            mounts.append(Mount("/acs/base", lower[1], type="bind", read_only=True))
        return mounts
