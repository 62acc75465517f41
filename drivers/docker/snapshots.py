"""The snapshot capability of the Docker driver (drivers/base.py: SandboxFiles): exports
(drivers/docker/files.py) and sandboxes made from a snapshot, copy-on-write
(drivers/docker/bases.py), on a thread lane of their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import structlog

from drivers.base import FileEntry, FileExport, FileItem, Hold, LocalCopy, SandboxRequest
from drivers.docker.bases import DockerBases
from drivers.docker.engine import DockerEngine
from drivers.docker.files import DockerExports, Lane
from drivers.errors import DriverError

log = structlog.get_logger(__name__)


class DockerFiles:
    """`image`: the helper containers' image (any with python3 3.9+)."""

    keeps_system = True

    def __init__(
        self,
        engine: DockerEngine,
        *,
        prefix: str,
        image: str,
        threads: int = 4,
        reuse_timeout: float = 60.0,
    ) -> None:
        self.lane = Lane(engine, threads)
        self.uploads = Lane(engine, threads)  # DockerBases: never the lane an export reads in
        self.bases = DockerBases(
            self.lane, self.uploads, prefix=prefix, image=image, reuse_timeout=reuse_timeout
        )
        self.exports = DockerExports(
            self.lane, prefix=prefix, image=image, stamped_base=self.bases.stamped_base
        )

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
        local: LocalCopy | None = None,
    ) -> AsyncIterator[FileExport]:
        """With `local` (a fork's), the base is prepared first and the export stages its copies
        in it (bases.py: `DockerBases.prepare`); a base that cannot be prepared costs only
        that (the build then makes its own volume and the engine extracts the files)."""
        staging = None
        if local is not None:
            try:
                staging = await self.bases.prepare(local.key, local.image, local.sandbox_ids)
            except DriverError as exc:
                log.warning("snapshot_base_not_prepared", key=local.key, error=str(exc))
        try:
            async with self.exports.export(
                sandbox_id,
                known,
                working_dir=working_dir,
                state_paths=state_paths,
                hold=hold,
                max_bytes=max_bytes,
                into=staging,
            ) as export:
                yield export
        except BaseException:
            if staging is not None:
                await asyncio.shield(self.bases.discard(staging))
            raise

    builds_locally = True

    async def build_local(
        self,
        key: str,
        image: str,
        items: AsyncIterator[FileItem],
        sandbox_ids: Sequence[str] = (),
        ready: Callable[[], None] | None = None,
    ) -> None:
        """The base of `key` for `image` (bases.py) from an export's stream, with the fork
        directories of `sandbox_ids` made with it; `ready` called once sandboxes can be made
        from it (with the export's helper laying it down, before the stream's end)."""
        await self.bases.build(key, image, items, sandbox_ids, ready)

    async def forget(self, key: str) -> None:
        await self.bases.forget(key)

    async def restored_workspace(
        self, request: SandboxRequest, volume: str, labels: dict[str, str]
    ) -> str:
        """The workspace volume of a sandbox made from `request.restore` (made unless it
        exists); the image its container runs."""
        return await self.bases.workspace(request, volume, labels)

    async def sweep(self, older_than: float) -> int:
        """Helper and loader containers, and the containers base images are committed from,
        older than `older_than` seconds (their operation is over: it died); base volumes that
        never got their image, or that no workspace uses any more."""
        return await self.lane.run(lambda c: self.bases.sweep(c, older_than))

    def close(self) -> None:
        self.lane.close()
        self.uploads.close()
