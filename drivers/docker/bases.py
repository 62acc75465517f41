"""Sandboxes made from a snapshot on Docker, sharing its files copy-on-write.

The first sandbox made from a snapshot (on an engine, for an image) builds its *base*: a volume
holding the snapshot's workspace under `lower/`, and an image, the spec's image with the
snapshot's system tree committed on top (a container of the image, never started, gets the tree
in its writable layer, whiteouts included, and is committed). Every sandbox made from it then
runs that image (overlay2 shares its layers) and gets a workspace volume of the local driver's
`overlay` type: the base's `lower/` below, an upper and a work directory of its own under the
base's `forks/<sandbox id>/` above. So N forks cost one restore plus N small directories, and
each writes only what it changes.

The base goes when the last sandbox made from it goes (its forks' upper directories with it).
Docker does not know that an overlay volume depends on the base, so the driver keeps that count
(by label) and serialises a base's build and release per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import docker
import structlog
from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import Mount

from drivers.base import (
    STATE,
    SYSTEM,
    WORKSPACE,
    FileEntry,
    FileItem,
    FileKind,
    FileSource,
    SandboxRequest,
)
from drivers.docker import names as docker_names
from drivers.docker.files import CARRIED, LABEL_SNAPSHOT, Lane, Staging
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE, LINK_CAPABILITIES, Helper
from drivers.docker.tar import Feed, archive
from drivers.errors import DriverError, ImageMissing

log = structlog.get_logger(__name__)

LABEL_BASE = "acs.base"
"""On a restored sandbox's workspace volume: the base volume it stands on."""
LABEL_BASE_IMAGE = "acs.base_image"
"""On the same volume: the image its container runs (the base's)."""
SIGNATURES = "acs-signatures.json"
STAMP_WAIT = 120.0
"""Seconds an export waits for its base's stamp (10,000 files take about a second)."""
LABEL_ROOT = "acs.workspace_root"
"""On a base image: its workspace root's "uid:gid:mode" (overlay's merged root is the upper
directory, which must have them)."""


@dataclass(frozen=True)
class OldWorkspace:
    """A rewinding sandbox's own workspace, which its new base takes what it can from."""

    volume: str
    gone: Awaitable[None]  # its container removed: nothing writes to it any more
    drop: Callable[[], Awaitable[None]]  # remove it (and its base, unless still used)


@dataclass(frozen=True)
class Base:
    volume: str
    mountpoint: str
    image: str
    root: str  # the workspace root's "uid:gid:mode": each fork's upper directory gets them


def _image_name(prefix: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", prefix.lower()).strip("-") + "-base"


class DockerBases:
    def __init__(
        self,
        lane: Lane,
        uploads: Lane,
        *,
        prefix: str,
        image: str,
        reuse_timeout: float = 60.0,
    ) -> None:
        """`uploads`: the threads the archives' uploads to the engine hold while their files
        stream (never `lane`'s: a fork's export, which feeds its base's upload, reads its
        batches in `lane`, and uploads holding all of its threads would wait for it forever).
        `reuse_timeout`: seconds a rewind waits for the `reuse` helper's answer
        (ACS_DOCKER_REUSE_TIMEOUT)."""
        self._lane = lane
        self._uploads = uploads
        self._reuse_timeout = reuse_timeout
        self._prefix = prefix
        self._image = image  # the helper's
        self._locks: dict[str, asyncio.Lock] = {}
        self._queued: dict[str, list[tuple[str, asyncio.Future[None]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # (base volume, sandbox id): the sandbox's fork directories were made with the base
        # (its build's archive), so its workspace needs no extraction of its own for them.
        self._dirs_made: set[tuple[str, str]] = set()
        # sandbox id -> the base `stage` found or built, or a fork's `build` made for it
        self._staged: dict[str, Base] = {}
        self._stamping: dict[str, asyncio.Task[None]] = {}  # base volume -> its `_stamp`
        # base volume -> (the engine's word on it, its staging): made by `prepare` for a
        # fork's export to stage its copies in, taken by the `build` that follows.
        self._prepared: dict[str, tuple[dict[str, Any], Staging]] = {}
        self._held: dict[str, Staging] = {}  # base volume -> the staging whose helper holds it
        # base volume -> the holder `prepare` made for it (its image's container), taken by
        # the build that follows, removed by `discard`.
        self._holders: dict[str, str] = {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def workspace(self, request: SandboxRequest, volume: str, labels: dict[str, str]) -> str:
        """Make the restored sandbox's workspace volume unless it exists; the image its
        container runs."""
        assert request.restore is not None
        found = await self._lane.run(lambda c: _volume(c, volume))
        if found is not None:
            return str((found.get("Labels") or {}).get(LABEL_BASE_IMAGE) or request.image)
        base = self._staged.pop(request.sandbox_id, None) or await self._ensure(request)
        async with self._lock(base.volume):
            made = (base.volume, request.sandbox_id)
            if made in self._dirs_made:
                self._dirs_made.discard(made)
            else:
                await self._fork_dirs(base, request.sandbox_id)
            work = f"{base.mountpoint}/forks/{request.sandbox_id}"
            options = {
                "type": "overlay",
                "device": "overlay",
                "o": f"lowerdir={base.mountpoint}/lower,upperdir={work}/up,workdir={work}/work",
            }
            marks = labels | {LABEL_BASE: base.volume, LABEL_BASE_IMAGE: base.image}
            await self._lane.run(
                lambda c: c.api.create_volume(
                    name=volume, driver="local", driver_opts=options, labels=marks
                )
            )
        return base.image

    async def stage(self, request: SandboxRequest, old: OldWorkspace | None = None) -> None:
        """Build the restoring request's base unless it exists; `workspace` then takes it
        without looking it up again (unless a release dropped it meanwhile). `old`: the
        sandbox's own workspace (a rewind), whose files the snapshot's are taken from where
        they are the same (`_reuse`), dropped once they are."""
        self._staged[request.sandbox_id] = await self._ensure(request, old)

    async def base_of(self, volume: str) -> str | None:
        """The base volume a workspace volume stands on; None for a plain one (or none)."""
        found = await self._lane.run(lambda c: _volume(c, volume))
        return None if found is None else (found.get("Labels") or {}).get(LABEL_BASE)

    async def prepare(self, key: str, image_name: str, sandbox_ids: Sequence[str] = ()) -> Staging:
        """The base volume of `key` (a new snapshot's) for `image_name`, made empty for a
        fork's export to stage its copies in and lay the workspace down in (files.py:
        `DockerExports.export`'s `into`): no byte is then written twice, nor re-extracted by
        the engine. With it the container its image is committed from (the holder, never
        started), whose writable layer the export's helper lays the system tree down in, and
        the directories of `sandbox_ids` (the forks to come) in the volume: the base is then
        whole when the helper answers, at the export's end, and the `build` that follows
        commits it without waiting for the stream (`_build_staged`). A holder that cannot be
        made costs only that (the build extracts the system tree from the stream). `discard`
        drops it all when the export fails."""
        image_id = await self._lane.run(lambda c: _image_id(c, image_name))
        name, image = self._names(key, image_id)
        async with self._lock(name):
            if await self._lane.run(lambda c: _volume(c, name)) is not None:
                raise DriverError(f"the base volume {name} exists already")
            labels = self._labels(key, image)
            # Both at once (the export's helper, which mounts them, waits for both).
            making = self._lane.start(lambda c: c.api.create_volume(name=name, labels=labels))
            holding = self._lane.start(lambda c: _holder(c, image_name, labels))
            made, held = await asyncio.gather(making, holding, return_exceptions=True)
            if isinstance(made, BaseException):
                if not isinstance(held, BaseException):
                    await self._lane.run(lambda c: _remove_holder(c, held[0]))
                raise made
            upper = ""
            if isinstance(held, BaseException):
                log.warning("snapshot_base_holder_not_made", volume=name, error=str(held))
            else:
                self._holders[name], upper = held
            staging = Staging(name, upper, sandbox_ids if upper else ())
            self._prepared[name] = (made, staging)
            self._held[name] = staging
            staging.released.add_done_callback(lambda _: self._unhold(name, staging))
        log.info("snapshot_base_prepared", snapshot=key, volume=name)
        return staging

    def _unhold(self, volume: str, staging: Staging) -> None:
        if self._held.get(volume) is staging:
            del self._held[volume]

    async def discard(self, staging: Staging) -> None:
        """Drop a prepared base (its export failed): once its helper is gone, the volume
        (and an image, if a build made one meanwhile); one a build took, only when no
        sandbox stands on it. Never raises (but a cancel): what it cannot remove is the
        sweep's (a volume the engine still counts in use)."""
        name = staging.volume
        if self._prepared.pop(name, None) is None:
            # A build took it: a failed build undoes itself; a built one goes with its
            # snapshot, never listed (Taker.take forgets it), or, when a fork's sandboxes were
            # started on it ahead of the listing, once they are withdrawn
            # (SnapshotService._withdraw): removing it here would pull it from under sandboxes
            # still being made on it.
            return
        await self._drop_prepared(name)

    async def _drop_prepared(self, name: str) -> None:
        """`discard`'s removal of a prepared base no build took: once the export's helper is
        gone, its holder and its volume (and an image, if one was made meanwhile). The holder
        waits for the helper too: the helper mounts the holder's layer, and the engine's reads
        of the helper's copies (the export's stream, still drained after a failed build) fail
        once that layer is gone."""
        holder = self._holders.pop(name, "")
        try:
            await self._unheld(name)
            if holder:
                await self._lane.run(lambda c: _remove_holder(c, holder))
            async with self._lock(name):
                found = await self._lane.run(lambda c: _volume(c, name))
                image = str(((found or {}).get("Labels") or {}).get(LABEL_BASE_IMAGE) or "")
                if image:
                    await self._lane.run(lambda c: _drop_image(c, image))
                await self._free_volume(name)
        except Exception as exc:
            log.warning("snapshot_base_not_dropped", volume=name, error=str(exc))

    async def _free_volume(self, name: str, tries: int = 20) -> None:
        """Remove a volume, waiting out a moment the engine still counts it in use (a helper
        container's removal it reported as in progress, 409, still under way)."""
        for attempt in range(tries):
            try:
                await self._lane.run(lambda c: _remove_volume(c, name))
                return
            except DriverError as exc:
                if "in use" not in str(exc) or attempt == tries - 1:
                    raise
            await asyncio.sleep(0.25)

    async def _unheld(self, volume: str) -> None:
        """Wait until no staging export's helper holds `volume` (the engine refuses to remove
        a volume in use); at most a minute (the helper's removal hangs: the sweep then)."""
        staging = self._held.get(volume)
        if staging is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(staging.released), 60.0)

    async def release(self, base_volume: str) -> None:
        """Remove the base (volume and image) when no workspace stands on it any more."""
        await self._unheld(base_volume)
        async with self._lock(base_volume):
            stamping = self._stamping.get(base_volume)
            if stamping is not None:  # its helper holds the volume: removal would fail
                # Shielded: a cancelled release does not cancel the stamp (the base would stay
                # without its record).
                await asyncio.gather(asyncio.shield(stamping), return_exceptions=True)
            await self._lane.run(lambda c: self._drop_unused(c, base_volume))
            if await self._lane.run(lambda c: _volume(c, base_volume)) is None:
                self._dirs_made = {made for made in self._dirs_made if made[0] != base_volume}
                self._staged = {s: b for s, b in self._staged.items() if b.volume != base_volume}

    async def forget(self, key: str) -> None:
        """Remove the unused bases of a snapshot."""
        labels = [f"{LABEL_OWNER}={self._prefix}", f"{LABEL_SNAPSHOT}={key}"]
        listed = await self._lane.run(lambda c: c.api.volumes(filters={"label": labels}))
        for volume in listed.get("Volumes") or []:
            await self.release(volume["Name"])

    def sweep(self, client: docker.DockerClient, older_than: float) -> int:
        """What interrupted operations left (DockerFiles.sweep). Blocking."""
        owned = {"label": [f"{LABEL_OWNER}={self._prefix}"]}
        cutoff = time.time() - older_than
        removed = 0
        for summary in client.api.containers(all=True, filters=owned):
            # A running helper is in use; a helper whose control plane died has exited (its
            # stdin closed), a loader or a holder was never started.
            if (summary.get("Labels") or {}).get(docker_names.LABEL_PREFIX):
                continue  # a sandbox's container: never the sweep's
            if summary["Id"] in self._holders.values():
                continue  # a prepared base's holder: its build commits it
            if summary.get("State") != "running" and summary.get("Created", 0) < cutoff:
                with contextlib.suppress(NotFound):
                    client.api.remove_container(summary["Id"], force=True, v=True)
                    removed += 1
        for volume in client.api.volumes(filters=owned).get("Volumes") or []:
            made = _created(volume)
            if made is None or made > cutoff or self._locks.get(volume["Name"], _FREE).locked():
                continue
            if volume["Name"] in self._held or volume["Name"] in self._prepared:
                continue  # a fork's export stages in it: its build comes
            image = (volume.get("Labels") or {}).get(LABEL_BASE_IMAGE)
            if image is None or _image_label(client, image, LABEL_ROOT) is None:
                with contextlib.suppress(NotFound):
                    client.api.remove_volume(volume["Name"], force=True)
                    removed += 1
            else:
                self._drop_unused(client, volume["Name"])
        return removed

    def _drop_unused(self, client: docker.DockerClient, base_volume: str) -> None:
        users = client.api.volumes(filters={"label": [f"{LABEL_BASE}={base_volume}"]})
        if users.get("Volumes"):
            return
        found = _volume(client, base_volume)
        if found is None:
            return
        image = (found.get("Labels") or {}).get(LABEL_BASE_IMAGE)
        if image and not _drop_image(client, image):
            return  # a container still runs the image: both stay, for the next release or sweep
        with contextlib.suppress(NotFound):
            client.api.remove_volume(base_volume, force=True)

    # -- building a base ------------------------------------------------------------------------

    async def build(
        self,
        key: str,
        image: str,
        items: AsyncIterator[FileItem],
        sandbox_ids: Sequence[str],
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Build the base of `key` for `image` from `items` (a fork's export as it streams:
        every workspace and system file with its bytes) unless it exists, with the fork
        directories of `sandbox_ids` (the forks to come) in it; the sandboxes made from `key`
        then find it (`workspace`), and `ready` is called. Where `prepare` made its holder, the
        export's helper lays the whole base down and the image is committed at its word,
        before the stream ends (`_build_staged`); the stream is read meanwhile for the files'
        signatures (`_stamp`), and the build returns at its end. Nothing of a failed build is
        left. The stream is consumed to its end either way (its producer is not left
        waiting)."""
        streamed = _Streamed(key, items)
        try:
            image_id = await self._lane.run(lambda c: _image_id(c, image))
            name, image_tag = self._names(key, image_id)
            prepared = self._prepared.get(name)
            if prepared is not None and prepared[1].system:
                await self._build_early(
                    key, name, image_tag, streamed, sandbox_ids=sandbox_ids, ready=ready
                )
                return
            base = await self._ensure_of(streamed, image, None, sandbox_ids=sandbox_ids)
        finally:
            self._unbuilt(key)
            await streamed.drain()
        # The forks' workspaces take it as it is (`workspace`): no look-up of the base again
        # per fork, each under the base's lock (a release that drops it meanwhile forgets it).
        for sandbox_id in sandbox_ids:
            self._staged[sandbox_id] = base
        if ready is not None:
            ready()

    async def _build_early(
        self,
        key: str,
        name: str,
        image: str,
        streamed: _Streamed,
        *,
        sandbox_ids: Sequence[str],
        ready: Callable[[], None] | None,
    ) -> None:
        """`build` on a base `prepare` made whole with its export: committed at the helper's
        word, the forks told (`ready`), then the stream read to its end for the signatures
        its stamp records. A stream that breaks after `ready` raises (the snapshot is then
        not listed, and its forks are withdrawn by their caller)."""
        reading = asyncio.create_task(_signatures(streamed.items()), name=f"signatures-{key}")
        try:
            base, answer = await self._build_staged(key, name, image, sandbox_ids, reading)
        except BaseException:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            raise
        for sandbox_id in sandbox_ids:
            self._staged[sandbox_id] = base
        if ready is not None:
            ready()
        signatures, workspace = await reading
        # The stream's end comes after the engine read the copies and the helper removed
        # them (files.py `_placed`, which counts them into the same answer).
        log.info("snapshot_base_cleaned", volume=name, cleaned=answer.get("cleaned"))
        if workspace != answer.get("placed"):
            # Never seen: the helper laid down its own listing, which the stream carries.
            raise DriverError(
                f"the base of {key} holds {answer.get('placed')} workspace entries, its "
                f"snapshot {workspace}"
            )
        self._begin_stamp(name, image, signatures, "")

    async def _build_staged(
        self,
        key: str,
        name: str,
        image: str,
        sandbox_ids: Sequence[str],
        stream: asyncio.Future[Any],
    ) -> tuple[Base, dict[str, Any]]:
        """The prepared base `name` once the export's helper said it laid it down whole
        (workspace, system tree in the holder's layer, forks' directories), its image
        committed from the holder; the helper's answer. `stream`: the reading of the
        export's stream, whose end (or failure) without the helper's word fails the build."""
        async with self._lock(name):
            prepared = self._prepared.pop(name, None)
            holder = self._holders.pop(name, "")
            if prepared is None or not holder:
                raise DriverError(f"the staged base volume {name} is gone")
            made, staging = prepared
            log.info("snapshot_base_building", snapshot=key, sandbox_id="", staged=True)
            began = time.monotonic()
            committing: asyncio.Future[Any] | None = None
            try:
                await asyncio.wait({staging.placed, stream}, return_when=asyncio.FIRST_COMPLETED)
                if not staging.placed.done():
                    stream.result()  # what broke it, if it did
                    raise DriverError("the export did not say how it laid the workspace down")
                answer = _answer(staging.placed.result())
                root = _placed_whole(staging, answer, len(sandbox_ids))
                placed = time.monotonic()
                labels = self._labels(key, image)
                # The image's labels pass to every container of it: only what they need. A
                # commit merges the holder's own labels in, so those are blanked.
                marks = {label: "" for label in labels} | {LABEL_SNAPSHOT: key, LABEL_ROOT: root}
                committing = self._lane.start(lambda c: _commit(c, holder, image, marks))
                await _landed(committing)
                log.info(
                    "snapshot_base_built",
                    snapshot=key,
                    staged=True,
                    wait_s=round(placed - began, 3),
                    commit_s=round(time.monotonic() - placed, 3),
                )
                self._dirs_made = {d for d in self._dirs_made if d[0] != name}
                self._dirs_made.update((name, fork) for fork in sandbox_ids)
            except BaseException:
                await self._undo(name, image, committed=committing is not None, staged=True)
                raise
            finally:
                # Off the forks' path: the image does not need its container any more.
                self._later(self._lane.run(lambda c: _remove_holder(c, holder)), f"holder-{name}")
            return Base(name, str(made["Mountpoint"]), image, root), answer

    def _unbuilt(self, key: str) -> None:
        """Drop the base volumes `prepare` made for `key` that its build did not take (the
        image was removed, or replaced by another, since: the build looked up no volume of that
        name, or failed before it did): nothing else would, while the snapshot stays listed
        (its `forget` comes with its deletion), and the sweep leaves a prepared volume alone.
        In the background (`discard` waits for the export's helper, which holds the volume
        until the export that feeds this build is over)."""
        for name, (made, _) in list(self._prepared.items()):
            if (made.get("Labels") or {}).get(LABEL_SNAPSHOT) == key:
                del self._prepared[name]
                log.info("snapshot_base_unbuilt", snapshot=key, volume=name)
                self._later(self._drop_prepared(name), f"discard-{name}")

    async def _ensure(self, request: SandboxRequest, old: OldWorkspace | None = None) -> Base:
        assert request.restore is not None
        return await self._ensure_of(request.restore, request.image, request, old)

    async def _ensure_of(
        self,
        source: FileSource,
        image_name: str,
        request: SandboxRequest | None,
        old: OldWorkspace | None = None,
        *,
        sandbox_ids: Sequence[str] = (),
    ) -> Base:
        """The base of `source` for `image_name`, built unless it exists; `request`: the
        sandbox it is built for (its fork directories come in the base's own archive, and a
        rewind's old workspace is read for it), None for a base built ahead of its sandboxes
        (`sandbox_ids`: theirs, whose fork directories come in its archive)."""
        sandbox_id = request.sandbox_id if request is not None else ""
        forks = [sandbox_id] if sandbox_id else list(sandbox_ids)
        image_id = await self._lane.run(lambda c: _image_id(c, image_name))
        name, image = self._names(source.key, image_id)
        async with self._lock(name):
            # Made by `prepare` for this build: the export staged its copies in it.
            prepared = self._prepared.pop(name, None) if request is None else None
            found = await self._lane.run(lambda c: _volume(c, name))
            root = await self._lane.run(lambda c: _image_label(c, image, LABEL_ROOT))
            if found is not None and root is not None:
                return Base(name, str(found["Mountpoint"]), image, root)
            log.info("snapshot_base_building", snapshot=source.key, sandbox_id=sandbox_id)
            began = time.monotonic()
            made = await self._new_volume(name, image, source.key, found, prepared)
            labels = self._labels(source.key, image)
            holder = ""
            dropping: asyncio.Future[None] | None = None
            committing: asyncio.Future[Any] | None = None
            try:
                # The image's own command and settings: the commit keeps the container's.
                holder = await self._lane.run(
                    lambda c: _create(c, image_name, labels=labels, network_disabled=True)
                )
                upper = await self._lane.run(lambda c: _upper(c, holder))
                held = frozenset[str]()
                if request is not None:
                    held = await self._reuse(request, str(made["Mountpoint"]), old)
                if old is not None:  # what it holds of the snapshot is linked: it may go
                    dropping = asyncio.ensure_future(old.drop())
                filling = time.monotonic()
                root, signatures = await self._fill(
                    source, forks, name, upper, held, staging=prepared[1] if prepared else None
                )
                filled = time.monotonic()
                # The image's labels pass to every container of it: only what they need. A
                # commit merges the holder's own labels in, so those are blanked (a label
                # that would make the sweep take a sandbox for a leftover).
                marks = {key: "" for key in labels} | {LABEL_SNAPSHOT: source.key, LABEL_ROOT: root}
                committing = self._lane.start(lambda c: _commit(c, holder, image, marks))
                await _landed(committing)
                log.info(
                    "snapshot_base_built",
                    snapshot=source.key,
                    prepare_s=round(filling - began, 3),
                    fill_s=round(filled - filling, 3),
                    commit_s=round(time.monotonic() - filled, 3),
                )
                # The stamp records each file's ctime, which a link count's change sets: the
                # files `_reuse` linked from the old workspace's base change theirs when that
                # base goes with the old workspace, so the stamp comes after (else a rewind
                # from this base finds none of them as recorded, and reads them all again).
                if dropping is not None:
                    await asyncio.gather(dropping, return_exceptions=True)
                # Off the start's path: the layers it reads never change, whatever the sandbox
                # does meanwhile (an export before it is done reads every file, as before).
                self._begin_stamp(name, image, signatures, sandbox_id)
                # A base built again (one swept meanwhile) has only these forks' directories.
                self._dirs_made = {made for made in self._dirs_made if made[0] != name}
                self._dirs_made.update((name, fork) for fork in forks)
            except BaseException:
                await self._undo(
                    name, image, committed=committing is not None, staged=bool(prepared)
                )
                raise
            finally:
                if dropping is not None:  # a failure: the caller removes it again, and says
                    await asyncio.gather(dropping, return_exceptions=True)
                if holder:
                    await self._lane.run(
                        lambda c: c.api.remove_container(holder, force=True, v=True)
                    )
            return Base(name, str(made["Mountpoint"]), image, root)

    async def _undo(self, name: str, image: str, *, committed: bool, staged: bool) -> None:
        """What a failed build made, removed: the image if its commit landed (`_landed`: no
        sweep finds an image), the volume (a prepared one, `staged`, once the export's helper
        is gone: it may hold it still, and waits for the stream this build stopped reading)."""
        if committed:
            await self._lane.run(lambda c: _drop_image(c, image))
        if staged:
            self._later(self._drop_staged(name, image), f"drop-{name}")
        else:
            await self._lane.run(lambda c: c.api.remove_volume(name, force=True))

    async def _drop_staged(self, name: str, image: str) -> None:
        """A prepared base whose build failed, removed once the export's helper is gone;
        unless a base was built in it since (a fork's restore from the store, which found the
        volume unfinished and built it again under the same name)."""
        await self._unheld(name)
        async with self._lock(name):
            if await self._lane.run(lambda c: _image_label(c, image, LABEL_ROOT)) is None:
                await self._free_volume(name)

    async def _new_volume(
        self,
        name: str,
        image: str,
        key: str,
        found: dict[str, Any] | None,
        prepared: tuple[dict[str, Any], Staging] | None,
    ) -> dict[str, Any]:
        """The empty base volume a build lays its files into: the one `prepare` made for it,
        or a new one (one left by an earlier build that did not finish removed first, once no
        export's helper holds it)."""
        if prepared is not None:
            if found is None:
                raise DriverError(f"the staged base volume {name} is gone")
            return prepared[0]
        if found is not None:
            # A prepared base whose build failed may still be held by its export's helper
            # (`_undo` leaves its removal for later): a restore that comes meanwhile waits for
            # that helper to go rather than fail on a volume the engine counts in use.
            await self._unheld(name)
            await self._free_volume(name)
        labels = self._labels(key, image)
        made: dict[str, Any] = await self._lane.run(
            lambda c: c.api.create_volume(name=name, labels=labels)
        )
        return made

    def _names(self, key: str, image_id: str) -> tuple[str, str]:
        """The base volume's and image's names for the content `key` on the image `image_id`."""
        name = f"{self._prefix}base-{key}-{image_id[7:19]}"
        return name, f"{_image_name(self._prefix)}:{key}-{image_id[7:19]}"

    def _labels(self, key: str, image: str) -> dict[str, str]:
        return {
            LABEL_OWNER: self._prefix,
            LABEL_SNAPSHOT: key,
            LABEL_BASE_IMAGE: image,
            LABEL_ROLE: "base",
        }

    def _later(self, work: Awaitable[None], name: str) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as exc:  # the sweep removes what is left
                log.warning("snapshot_base_not_dropped", task=name, error=str(exc))

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fill(
        self,
        source: FileSource,
        sandbox_ids: list[str],
        volume: str,
        upper: str,
        held: frozenset[str],
        *,
        staging: Staging | None = None,
    ) -> tuple[str, dict[str, dict[str, list[object]]]]:
        """The source's workspace tree into the base volume's lower/ and its system (and
        state) trees into the holder's writable layer, extracted by the engine from one
        archive (a container that never starts holds the mounts); the workspace root's
        "uid:gid:mode", and the signature in the snapshot of each file laid down ({tree:
        {path: signature}}, for `_stamp`). The workspace files in `held` are in lower/
        already (`_reuse`): left out of the archive, and not fetched. `sandbox_ids`: the
        sandboxes whose fork directories come in the same archive. With `staging` (a prepared
        base), the export's helper lays the workspace tree down itself (`_placed`): the archive
        holds the system tree and the fork directories alone."""
        root = "0:0:493"
        workspace = 0  # the workspace entries streamed
        signatures: dict[str, dict[str, list[object]]] = {}
        # Paths (per destination) that are not directories: nothing is extracted beneath one,
        # which the engine would otherwise write through a link (entries come parents first).
        leaves: set[tuple[bool, str]] = set()
        left_out: list[str] = []  # layer entries named as whiteouts (`reserved`)

        def name_of(entry: FileEntry) -> str | None:
            nonlocal root
            where = (entry.tree == WORKSPACE, entry.path)
            parts = entry.path.split("/")
            if any((where[0], "/".join(parts[:n])) in leaves for n in range(1, len(parts))):
                return None
            if entry.kind != FileKind.DIR and entry.path:
                leaves.add(where)
            if entry.kind == FileKind.FILE:
                signatures.setdefault(entry.tree, {})[entry.path] = list(entry.signature())
            if entry.tree == WORKSPACE:
                if entry.path == "":
                    root = f"{entry.uid}:{entry.gid}:{entry.mode}"
                nonlocal workspace
                workspace += 1
                laid = staging is not None or entry.path in held  # by the helper, or reused
                return None if laid else f"acs/ws/lower/{entry.path}".rstrip("/")
            # The state tree comes only when the source gives it (a rewind of the sandbox it
            # was taken of); it lies in the same writable layer as the system tree.
            if entry.tree in (SYSTEM, STATE):
                return _layer_name(entry.path, left_out)
            return None

        forks: set[FileEntry] = set()

        async def items() -> AsyncIterator[FileItem]:
            async for item in source.items(held):
                yield item
            # The sandboxes' own fork directories, with the root's owner and mode now known.
            made = _fork_entries(root, sandbox_ids)
            forks.update(made)
            for entry in made:
                yield entry

        def named(entry: FileEntry) -> str | None:
            return f"acs/ws/{entry.path}" if forks and entry in forks else name_of(entry)

        mounts = [Mount("/acs/ws", volume, type="volume"), Mount("/acs/upper", upper, type="bind")]
        await self._extract(mounts, archive(items(), named))
        _left_out(left_out)
        _placed(staging, workspace)
        return root, signatures

    async def _reuse(
        self, request: SandboxRequest, mountpoint: str, old: OldWorkspace | None
    ) -> frozenset[str]:
        """For a rewind (`old`: the sandbox's workspace, read once its container is gone): the
        snapshot's workspace files that the lower directory of the base it stands on holds as
        they were when the snapshot was taken (the same signature, through the record `_stamp`
        left in that base; a plain workspace has none, and gives nothing), hard-linked into
        the new base's lower/ (`mountpoint` is the new base volume's) by a helper
        (files_helper.py: reuse); their paths. Only the others then come out of the store.
        Both volumes are on the engine's volume directory: the helper gets that directory (a
        link cannot cross mounts), and touches nothing in it but that lower directory and the
        new lower/. A failure costs only speed (every file then comes out of the store; a link
        already made is replaced by the archive)."""
        if old is None or request.restore is None:
            return frozenset()
        started = time.monotonic()
        try:
            # Only the lower directory of the base the old workspace stands on (once its record
            # of what it laid down is written), never a layer the agent could write (a plain
            # volume, the overlay's upper): a write through a shared memory mapping changes a
            # file's bytes without its ctime, so a signature proves nothing of a file the agent
            # could write, and its bytes would outlive the rewind. The agent cannot write the
            # lower (any open for writing copies the file up), and it holds only files of the
            # store's, checked, or linked from an earlier lower: so no agent byte enters it.
            under = await self.stamped_base(old.volume)
            base = None if under is None else await self._lane.run(lambda c: _volume(c, under))
            if base is None:
                return frozenset()
            top = str(base["Mountpoint"])
            root = os.path.commonpath([mountpoint, top])

            def inside(path: str) -> str:
                return f"/acs/vols/{os.path.relpath(path, root)}"

            files = await request.restore.workspace()
            known = {
                WORKSPACE: {e.path: list(e.signature()) for e in files if e.kind == FileKind.FILE}
            }
            ask: dict[str, Any] = {
                "op": "reuse",
                "known_file": f"/tmp/{SIGNATURES}",  # noqa: S108 (the helper's own)
                "layers": [inside(f"{top}/lower")],
                "carried_file": inside(f"{top}/{CARRIED}"),
                "target": inside(f"{mountpoint}/lower"),
            }
            named = json.dumps(known, separators=(",", ":")).encode()
            # Not recursive: the volume directory alone, none of the mounts below it (the
            # overlays of running sandboxes, the old sandbox's own while it goes).
            volumes = Mount("/acs/vols", root, type="bind")
            volumes["BindOptions"] = {"NonRecursive": True}
            helper = await self._lane.run(
                lambda c: Helper.start(
                    c,
                    image=self._image,
                    prefix=self._prefix,
                    sandbox_id=request.sandbox_id,
                    mounts=[volumes],
                    files={SIGNATURES: named},
                    capabilities=LINK_CAPABILITIES,
                )
            )
            try:
                await old.gone
                # A helper that hangs (a volume directory the engine cannot read, a stuck
                # filesystem) costs this long at most; removing it ends the thread's wait.
                # asyncio.timeout, not wait_for: on 3.11 wait_for returns an answer that came
                # in the same loop pass as its deadline (a loop late under load), so a limit
                # was kept or not by chance; here a deadline passed is a deadline passed.
                try:
                    async with asyncio.timeout(self._reuse_timeout):
                        answer = await self._lane.run(lambda _: helper.ask(ask))
                except TimeoutError:
                    raise DriverError(
                        f"the reuse helper did not answer in {self._reuse_timeout} s "
                        "(ACS_DOCKER_REUSE_TIMEOUT)"
                    ) from None
            finally:
                await self._lane.run(lambda _: helper.close())
        except Exception as exc:  # any failure costs speed only, never the rewind
            log.warning(
                "snapshot_rewind_reuse_failed", sandbox_id=request.sandbox_id, error=str(exc)
            )
            return frozenset()
        reused = frozenset(str(path) for path in answer.get("reused") or [])
        log.info(
            "snapshot_rewind_reused",
            sandbox_id=request.sandbox_id,
            files=len(reused),
            bytes=answer.get("bytes"),
            took=round(time.monotonic() - started, 3),
        )
        return reused

    async def stamped_base(self, volume: str) -> str | None:
        """The base the workspace `volume` stands on (None for a plain one), once the base's
        record of its files is written when this process writes it now (an export right after
        a restore waits for it rather than read every file); at most STAMP_WAIT seconds: a
        stamp that hangs costs the export a full read, never the export (the record is written
        whole or not at all)."""
        base = await self.base_of(volume)
        stamping = None if base is None else self._stamping.get(base)
        if stamping is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(asyncio.shield(stamping), return_exceptions=True), STAMP_WAIT
                )
        return base

    def _begin_stamp(
        self,
        volume: str,
        image: str,
        signatures: dict[str, dict[str, list[object]]],
        sandbox_id: str,
    ) -> None:
        """`_stamp` in the background, which `stamped_base` and `release` wait for."""
        stamping = asyncio.create_task(
            self._stamp(volume, image, signatures, sandbox_id), name=f"stamp-{volume}"
        )
        self._stamping[volume] = stamping
        stamping.add_done_callback(lambda done: self._stamped(volume, done))

    def _stamped(self, volume: str, done: asyncio.Task[None]) -> None:
        if self._stamping.get(volume) is done:
            del self._stamping[volume]

    async def _stamp(
        self,
        volume: str,
        image: str,
        signatures: dict[str, dict[str, list[object]]],
        sandbox_id: str,
    ) -> None:
        """Record in the base volume (CARRIED) each file's signature as laid down beside its
        signature in the snapshot (files_helper.py: stamp), so that the first snapshot of a
        sandbox made from the base reads only what changed since. Nothing ever writes to a
        base once built (a sandbox writes to its own overlay upper directory): what an
        export later finds with the same signature is the snapshot's file. Taken from where
        exports see them: overlay shows a fork's untouched workspace files with their lower/
        inode and ctime (a write, a chmod or a `touch -d` copies the file up with a new
        ctime), and the system and state trees are the base image's top layer itself. A
        failure costs only speed: the first snapshot then reads every file, as before. Never
        raises (but a cancel)."""
        started = time.monotonic()
        try:
            top = await self._lane.run(
                lambda c: str(c.images.get(image).attrs["GraphDriver"]["Data"]["UpperDir"])
            )
            mounts = [
                Mount("/acs/ws", volume, type="volume"),
                Mount("/acs/base", top, type="bind", read_only=True),
            ]
            named = json.dumps(signatures, separators=(",", ":")).encode()
            helper = await self._lane.run(
                lambda c: Helper.start(
                    c,
                    image=self._image,
                    prefix=self._prefix,
                    sandbox_id=sandbox_id,
                    mounts=mounts,
                    files={SIGNATURES: named},
                )
            )
            try:
                request = {
                    "op": "stamp",
                    "entries_file": f"/tmp/{SIGNATURES}",  # noqa: S108 (the helper's own)
                    "roots": {WORKSPACE: "/acs/ws/lower", SYSTEM: "/acs/base", STATE: "/acs/base"},
                    "out": f"/acs/ws/{CARRIED}",
                }
                answer = await self._lane.run(lambda _: helper.ask(request))
            finally:
                await self._lane.run(lambda _: helper.close())
            took = round(time.monotonic() - started, 3)
            log.info("snapshot_base_stamped", volume=volume, took=took, **answer)
        except Exception as exc:  # a background task's: costs only the first snapshot's speed
            log.warning("snapshot_base_not_stamped", volume=volume, error=str(exc))

    async def _extract(self, mounts: list[Mount], pieces: AsyncIterator[bytes]) -> None:
        """Have the engine extract an archive at / of a container holding `mounts` (made for
        it, never started, removed after)."""
        loader = await self._lane.run(
            lambda c: _create(
                c,
                self._image,
                ["true"],
                labels={LABEL_OWNER: self._prefix, LABEL_ROLE: "files"},
                network_disabled=True,
                host_config=c.api.create_host_config(mounts=mounts, network_mode="none"),
            )
        )
        feed = Feed()
        upload = asyncio.create_task(
            self._uploads.run(lambda c: c.api.put_archive(loader, "/", feed.pieces()))
        )
        try:
            try:
                async for piece in pieces:
                    await feed.put(piece)
            except BaseException as exc:
                await feed.put(DriverError(f"the files to restore failed: {exc}"))
                raise
            await feed.put(None)
            if not await upload:
                raise DriverError("the engine did not extract the restored files")
        finally:
            if not upload.done():
                feed.stopped.set()
            await asyncio.gather(upload, return_exceptions=True)
            await self._lane.run(lambda c: c.api.remove_container(loader, force=True))

    async def _fork_dirs(self, base: Base, sandbox_id: str) -> None:
        """The sandbox's upper and work directories in the base: made at once for every
        sandbox asking meanwhile (a fork of many costs one engine extraction, not one each)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queued.setdefault(base.volume, [])
        queue.append((sandbox_id, future))
        if len(queue) == 1:
            task = asyncio.create_task(self._make_dirs(base), name=f"fork-dirs-{base.volume}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await future

    async def _make_dirs(self, base: Base) -> None:
        await asyncio.sleep(0)  # let the others of a fork queue up
        queue = self._queued.pop(base.volume, [])
        entries = _fork_entries(base.root, [sandbox_id for sandbox_id, _ in queue])

        async def listed() -> AsyncIterator[FileItem]:
            for entry in entries:
                yield entry

        try:
            mounts = [Mount("/acs/ws", base.volume, type="volume")]
            await self._extract(mounts, archive(listed(), lambda e: f"acs/ws/{e.path}"))
        except Exception as exc:
            for _, future in queue:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for _, future in queue:
                future.cancel()
            raise
        for _, future in queue:
            if not future.done():
                future.set_result(None)


_FREE = asyncio.Lock()


def _placed(staging: Staging | None, streamed: int) -> None:
    """Raise unless the export's helper laid down every workspace entry the stream carried
    (`streamed`) and removed its copies: the base then holds what the snapshot holds, byte for
    byte (each file a link of the very copy the writer read). No staging: nothing to check."""
    if staging is None:
        return
    if not staging.placed.done():  # the stream ends only after the helper's word
        raise DriverError("the export did not say how it laid the workspace down")
    answer = staging.placed.result()
    if isinstance(answer, Exception):
        raise answer
    log.info(
        "snapshot_base_placed",
        volume=staging.volume,
        placed=answer.get("placed"),
        bytes=answer.get("bytes"),
        cleaned=answer.get("cleaned"),
        opened=answer.get("opened"),
    )
    if answer.get("error") or answer.get("missed") or answer.get("placed") != streamed:
        why = answer.get("error") or _shown(answer.get("skipped"))
        raise DriverError(
            f"the staged workspace was laid down in part: {answer.get('placed')} of {streamed} "
            f"entries, {answer.get('missed')} missed ({why})"
        )
    if answer.get("cleaned") is None:
        raise DriverError("the export's staged copies were not removed")


WHITEOUT_PREFIX = ".wh."  # files_helper.py's: the OCI image spec reserves it for whiteouts


def reserved(path: str) -> bool:
    """A system or state path with a name (its own or a parent's) that the engine takes for a
    whiteout once the holder's layer is committed: ".wh.x" would hide the image's x, and
    ".wh..wh..opq" the image's whole directory, in every sandbox of the base, and the file
    itself would be gone. Such an entry is left out of the base (files_helper.py `place`
    does the same), as the snapshot's sockets and fifos are."""
    return any(name.startswith(WHITEOUT_PREFIX) for name in path.split("/"))


def _layer_name(path: str, left_out: list[str]) -> str | None:
    """A system or state path's name in the archive the engine extracts into the holder's
    layer; None (and noted in `left_out`) for one named as a whiteout (`reserved`)."""
    if reserved(path):
        left_out.append(path)
        return None
    return f"acs/upper/{path}"


def _left_out(paths: list[str]) -> None:
    """Said when a restore left entries named as whiteouts out (`reserved`)."""
    if paths:
        log.warning("snapshot_whiteout_names_left_out", count=len(paths), paths=paths[:SHOWN_PATHS])


def _answer(answer: dict[str, Any] | Exception) -> dict[str, Any]:
    """The export helper's word on the base it laid down; raises what stopped it."""
    if isinstance(answer, Exception):
        raise answer
    return answer


def _placed_whole(staging: Staging, answer: dict[str, Any], forks: int) -> str:
    """The workspace root's "uid:gid:mode" once the export's helper laid the whole base down
    (`DockerBases.prepare`): every workspace and system entry of its listing, the forks'
    directories; raises otherwise (the base is then not built: its forks build it from the
    store once the snapshot is listed)."""
    log.info(
        "snapshot_base_placed",
        volume=staging.volume,
        placed=answer.get("placed"),
        listed=answer.get("listed"),
        system=answer.get("system"),
        reserved=answer.get("reserved"),
        forks=answer.get("forks"),
        bytes=answer.get("bytes"),
        opened=answer.get("opened"),
    )
    root = str(answer.get("root") or "")
    whole = answer.get("placed") == answer.get("listed") and answer.get("forks") == forks
    if answer.get("error") or answer.get("missed") or not whole or answer.get("system") is None:
        why = answer.get("error") or _shown(answer.get("skipped"))
        raise DriverError(
            f"the staged base was laid down in part: {answer.get('placed')} of "
            f"{answer.get('listed')} workspace entries, {answer.get('missed')} missed ({why})"
        )
    if not re.fullmatch(r"\d+:\d+:\d+", root):
        raise DriverError(f"the staged base's workspace root is {root[:40]!r}")
    return root


async def _signatures(
    items: AsyncIterator[FileItem],
) -> tuple[dict[str, dict[str, list[object]]], int]:
    """A base's stream read to its end: each file's signature in the snapshot ({tree: {path:
    signature}}, for `_stamp`) and how many workspace entries it carried."""
    signatures: dict[str, dict[str, list[object]]] = {}
    workspace = 0
    async for item in items:
        if isinstance(item, bytes):
            continue
        if item.tree == WORKSPACE:
            workspace += 1
        if item.kind == FileKind.FILE:
            signatures.setdefault(item.tree, {})[item.path] = list(item.signature())
    return signatures, workspace


SHOWN_PATHS = 20
SHOWN_LENGTH = 123  # files_helper.py `shown`: 120 characters and "..."


def _shown(paths: object) -> list[str]:
    """The skipped paths the helper named, as the error shows them: the helper bounds them
    (files_helper.py `shown_all`: 20, each 120 characters) and so does this, whatever it
    sent (its answer is read from a container that mounts the agent's files)."""
    named = paths if isinstance(paths, list) else []
    return [str(path)[:SHOWN_LENGTH] for path in named[:SHOWN_PATHS]]


async def _landed(call: asyncio.Future[Any]) -> None:
    """Wait for an engine call already in a thread; a cancel waits for the call to land
    before it goes on (the thread carries on regardless: what it makes is then there for the
    caller's cleanup to remove, not made after it)."""
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.gather(call, return_exceptions=True)
        raise


def _commit(client: docker.DockerClient, holder: str, image: str, labels: dict[str, str]) -> None:
    repository, _, tag = image.partition(":")
    client.api.commit(holder, repository=repository, tag=tag, conf={"Labels": labels}, pause=False)


def _drop_image(client: docker.DockerClient, image: str) -> bool:
    """Remove a base's image (an unused base's, a failed build's) unless a container runs it
    (409: kept for now, False). One that is gone is as good as removed, whatever the engine
    said: of two removals at once the second is told "unrecognized image ID" (a 500, seen in a
    full run as a sandbox's removal failing)."""
    try:
        client.api.remove_image(image, force=False, noprune=False)
    except (ImageNotFound, NotFound):
        pass
    except APIError as exc:
        if exc.status_code == 409:
            return False
        try:
            client.images.get(image)
        except (ImageNotFound, NotFound):
            return True
        raise
    return True


def _holder(
    client: docker.DockerClient, image_name: str, labels: dict[str, str]
) -> tuple[str, str]:
    """A container of `image_name` (never started: its own command and settings, which the
    commit keeps) to commit a base's image from, and its writable layer's host path."""
    holder = _create(client, image_name, labels=labels, network_disabled=True)
    try:
        return holder, _upper(client, holder)
    except BaseException:
        _remove_holder(client, holder)
        raise


def _remove_holder(client: docker.DockerClient, holder: str) -> None:
    with contextlib.suppress(NotFound):
        client.api.remove_container(holder, force=True, v=True)


class _Streamed:
    """An export's stream as the FileSource a base is built from (`DockerBases.build`)."""

    def __init__(self, key: str, items: AsyncIterator[FileItem]) -> None:
        self._key = key
        self._items = items

    @property
    def key(self) -> str:
        return self._key

    def items(self, held: Collection[str] = ()) -> AsyncIterator[FileItem]:
        return self._items

    async def workspace(self) -> list[FileEntry]:
        raise DriverError("a streamed base has no index to compare with")

    async def drain(self) -> None:
        """Read what is left of the stream (a base found already, a build that failed)."""
        async for _ in self._items:
            pass


def _fork_entries(root: str, sandbox_ids: list[str]) -> list[FileEntry]:
    """The `forks/` directory of a base and, per sandbox, its upper directory (owner and mode
    those of the workspace root, "uid:gid:mode") and its overlay work directory, parents first."""
    uid, gid, mode = (int(x) for x in root.split(":"))
    now = time.time_ns()
    entries = [FileEntry(WORKSPACE, "forks", FileKind.DIR, 0o755, mtime_ns=now)]
    for sandbox_id in sandbox_ids:
        top = f"forks/{sandbox_id}"
        entries += [
            FileEntry(WORKSPACE, top, FileKind.DIR, 0o700, mtime_ns=now),
            FileEntry(WORKSPACE, f"{top}/up", FileKind.DIR, mode, uid, gid, mtime_ns=now),
            FileEntry(WORKSPACE, f"{top}/work", FileKind.DIR, 0o700, mtime_ns=now),
        ]
    return entries


def _created(volume: dict[str, Any]) -> float | None:
    """A volume's creation time (Unix seconds); None when the engine does not say."""
    text = str(volume.get("CreatedAt") or "")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _remove_volume(client: docker.DockerClient, name: str) -> None:
    with contextlib.suppress(NotFound):
        client.api.remove_volume(name, force=True)


def _volume(client: docker.DockerClient, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.api.inspect_volume(name)
    except NotFound:
        return None
    return found


def _image_id(client: docker.DockerClient, image: str) -> str:
    try:
        return str(client.images.get(image).id)
    except (ImageNotFound, NotFound):
        raise ImageMissing(
            f"image {image} is not on this host; run `make images` to build it"
        ) from None


def _image_label(client: docker.DockerClient, image: str, label: str) -> str | None:
    """A label of the image; None when the image (or the label) is absent."""
    try:
        labels = client.images.get(image).labels or {}
    except (ImageNotFound, NotFound):
        return None
    value = labels.get(label)
    return str(value) if value is not None else None


def _create(client: docker.DockerClient, image: str, command: Any = None, **options: Any) -> str:
    return str(client.api.create_container(image, command, **options)["Id"])


def _upper(client: docker.DockerClient, container: str) -> str:
    driver = client.api.inspect_container(container).get("GraphDriver") or {}
    upper = (driver.get("Data") or {}).get("UpperDir")
    if driver.get("Name") != "overlay2" or not upper:
        raise DriverError(
            f"the engine's storage driver is {driver.get('Name')!r}: snapshots need overlay2"
        )
    return str(upper)
