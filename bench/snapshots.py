"""Snapshot, fork and hibernation benchmark (issue 28), each figure beside the raw operation
measured in the same run:

- checkpoint: a sandbox with a 1 GiB workspace of 10,000 files; after 10 MiB of changes (100
  files rewritten) a snapshot through the API (POST /api/v1/sandboxes/{id}/snapshots), its
  wall time, how long the sandbox was frozen, and the bytes it added to the store, against the
  raw copy of the same changed bytes out of the sandbox (`tar` through `docker exec`) into the
  store (one blob). Targets: p50 <= 1.5 s, stored <= 1.2x the changed bytes. Then, in the same
  phase, rewind: after each checkpoint the agent writes a file and the sandbox is rewound to that
  checkpoint (SandboxService.rewind, what a conversation's rewind calls, until RUNNING; the file
  must be gone and a changed file's bytes those of the checkpoint), against a raw copy of the
  same bytes out of the store: every pack the snapshot's manifest lists fetched from the
  registry and written into the workspace of a raw container of the spec started to /health.
  Target: <= 1.2x the raw. Beside it, the bytes the rewind read out of the store (on Docker
  only the files changed since the checkpoint: the others come from the sandbox's old
  workspace; the raw restore still copies every pack). After each rewind, the first
  checkpoint after 10 MiB of changes, printed beside the checkpoint above (the files it read:
  what changed, not the workspace).
- fork: a sandbox with a 100 MiB workspace forked into 1, 5, 10 and 20 (POST .../fork) until
  all are RUNNING, against N raw containers of the same spec started at once (empty
  workspaces) until their /health answers. Target: 10 in <= 5 s p50.
- message: what a conversation's checkpoint costs the user's message (issue 28 item 2): on a
  sandbox with a 100 MiB workspace of 1,000 files, after 1 MiB changed, the time the message
  waits (until the snapshot's files are read and the sandbox thawed: SnapshotService.begin's
  `captured`) against the whole snapshot (sent and listed, in the background) and a raw
  `docker pause` + `docker unpause`. No target in the issue beyond "not noticeably": printed.
- hibernate: a paused (frozen) sandbox's memory against a hibernated one's, and a hibernated
  sandbox's resume (the API's resume until RUNNING) against a raw `docker start` of a stopped
  container of the same spec + its /health. Targets: <= 5 % of the memory, <= 1.2x the raw.

Run with `.venv/bin/python -m bench.snapshots [--runs N] [--quick]`; a private redis-server and
a private docker-registry (Debian's) are started, and everything is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import BenchError, Deployment, Samples, main_of, ms, percentile, serve
from bench.warm_pool import cgroup_bytes
from controlplane import keys
from controlplane.snapshots.reader import Fetched
from controlplane.snapshots.registry import Registry
from drivers.docker import names as docker_names
from tests.support.registry_server import RegistryServer

MIB = 1024**2
FILE = 100 * 1024
POLL = 0.02
TARGET_CHECKPOINT_S = 1.5
TARGET_STORED_RATIO = 1.2
TARGET_FORK10_S = 5.0
TARGET_HIBERNATED_SHARE = 0.05
TARGET_RESUME_RATIO = 1.2
TARGET_REWIND_RATIO = 1.2
PACK_FETCHES = 4  # packs fetched at once by the raw restore, as the restore's prefetch does
PHASES = ("checkpoint", "fork", "message", "hibernate")
MESSAGE_FILES = 1000

FILL = """
import os, sys
root, files, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for n in range(files):
    d = os.path.join(root, "d%03d" % (n // 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.bin" % n), "wb") as f:
        f.write(os.urandom(size))
"""
CHANGE = """
import os, random, sys
root, files, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
picked = random.Random(seed).sample(range(files), int(sys.argv[5]))
for n in picked:
    with open(os.path.join(root, "d%03d" % (n // 100), "f%05d.bin" % n), "wb") as f:
        f.write(os.urandom(size))
print(" ".join("d%03d/f%05d.bin" % (n // 100, n) for n in picked))
"""


@dataclass
class Options:
    runs: int
    files: int
    fork_files: int
    counts: list[int]
    json_path: Path | None
    phases: list[str]
    starts: int | None = None  # ACS_MAX_CONCURRENT_STARTS; None: the control plane's default


class SnapshotBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.raw = Deployment(tmp, redis_url, f"acs-bench-snap-{int(time.time()) % 100000}-")
        self.registry_server = RegistryServer(tmp / "registry")
        self.samples = Samples()
        self.notes: list[str] = []
        self.figures: dict[str, Any] = {}
        self.http: aiohttp.ClientSession | None = None
        self.url = ""
        self.app: Any = None
        self.headers: dict[str, str] = {}

    # -- run_main's protocol --------------------------------------------------------------------

    async def measure(self) -> tuple[list[str], list[str]]:
        self.raw.preflight()
        print(self.raw.environment(), flush=True)
        self.registry_server.start()
        config = self.raw.config(
            snapshot_store_url=self.registry_server.url,
            snapshot_store_repository="bench",
            max_running_per_user=0,
            max_sandboxes_per_user=0,
            snapshot_max_bytes_per_user=0,
            snapshot_keep_last=0,
            request_timeout=3600,  # the first snapshot of 1 GiB takes minutes on a busy host
            start_timeout=300,  # 20 agent servers booting at once on a busy 2-core host
            max_concurrent_starts=self.options.starts,
        )
        self.raw.api_config = config
        try:
            async with serve(config, self.samples) as served, aiohttp.ClientSession() as http:
                self.http, self.url, self.app = http, served.url, served.app
                self.raw.health_http = http
                await self.raw.attach(served.app)
                self.headers = {"X-Session-API-Key": await self.raw.user_key("bench")}
                phases = {
                    "checkpoint": self.checkpoints,
                    "fork": self.forks,
                    "message": self.message_path,
                    "hibernate": self.hibernation,
                }
                for name in self.options.phases:
                    try:
                        await phases[name]()
                    except BenchError as exc:  # the others still run; the table says so
                        self.notes.append(f"{name} failed: {exc}")
                        print(f"bench: {name} failed: {exc}", file=sys.stderr, flush=True)
        finally:
            self.registry_server.stop()
        return self.table()

    def results(self) -> Any:
        return {**self.samples.values, **self.figures}

    def remove_everything(self) -> int:
        removed = self.raw.remove_everything()
        for image in self.raw.docker.images.list(name=self.raw.prefix.rstrip("-") + "-base"):
            with contextlib.suppress(Exception):
                self.raw.docker.images.remove(str(image.id), force=True)
        return removed

    def close(self) -> None:
        self.raw.close()

    # -- helpers ------------------------------------------------------------------------------

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        async with self.http.request(
            method, self.url + path, json=body, headers=self.headers
        ) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise BenchError(f"{method} {path}: {resp.status} {data}")
            return data

    async def running(self, sandbox_id: str) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            body = await self.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
            if body["status"] == "RUNNING":
                return
            if body["status"] in ("ERROR", "MISSING"):
                raise BenchError(f"sandbox {sandbox_id}: {body['status']} {body['reason']}")
            await asyncio.sleep(POLL)
        raise BenchError(f"sandbox {sandbox_id} not RUNNING in 180 s")

    async def new_sandbox(self) -> str:
        body = await self.call("POST", "/api/v1/sandboxes", {})
        await self.running(body["id"])
        return str(body["id"])

    def container(self, sandbox_id: str) -> Any:
        name = docker_names.container_name(self.raw.prefix, sandbox_id)
        return self.raw.docker.containers.get(name)

    async def run_in(self, sandbox_id: str, *argv: str) -> str:
        def run() -> str:
            result = self.container(sandbox_id).exec_run(list(argv), user="agent")
            if result.exit_code != 0:
                raise BenchError(f"{argv[:2]} failed: {result.output[-300:]!r}")
            return str(result.output.decode())

        return await asyncio.to_thread(run)

    # -- checkpoint ---------------------------------------------------------------------------

    async def checkpoints(self) -> None:
        files = self.options.files
        sandbox_id = await self.new_sandbox()
        started = time.perf_counter()
        await self.run_in(
            sandbox_id, "python3", "-c", FILL, "/workspace/data", str(files), str(FILE)
        )
        took = time.perf_counter() - started
        print(f"checkpoint: {files * FILE / MIB:.0f} MiB written in {took:.1f} s", flush=True)
        started = time.perf_counter()
        first = await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/snapshots", {})
        self.figures["first_snapshot_s"] = time.perf_counter() - started
        self.figures["first_snapshot_stored"] = first["stored_bytes"]
        registry = Registry(self.http, self.registry_server.url)  # type: ignore[arg-type]
        changed = max(1, 10 * MIB // FILE)
        taken_ids: list[tuple[str, str, str]] = []
        for run in range(self.options.runs):
            names = (await self.run_in(
                sandbox_id, "python3", "-c", CHANGE, "/workspace/data", str(files), str(FILE),
                str(run), str(changed),
            )).split()  # fmt: skip
            started = time.perf_counter()
            taken = await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/snapshots", {})
            self.samples.add("checkpoint", time.perf_counter() - started)
            self.samples.add("checkpoint held still", taken["held_still_seconds"])
            self.samples.add("checkpoint stored ratio", taken["stored_bytes"] / (changed * FILE))
            self.samples.add(
                "raw copy to the store", await self.raw_copy(sandbox_id, names, registry)
            )
            # What the rewind to this checkpoint must bring back (read after it was taken).
            digest = await self.run_in(sandbox_id, "md5sum", f"/workspace/data/{names[0]}")
            taken_ids.append((taken["id"], names[0], digest))
        # The rewinds after every checkpoint run, each followed by a checkpoint after 10 MiB of
        # changes: the rewound files are new (new inodes and change times), and only the
        # signatures carried across the rewind keep that checkpoint from reading them all.
        for run, (snapshot_id, changed_file, digest) in enumerate(reversed(taken_ids)):
            await self.rewind(sandbox_id, snapshot_id, changed_file, digest, registry)
            await self.run_in(
                sandbox_id, "python3", "-c", CHANGE, "/workspace/data", str(files), str(FILE),
                str(1000 + run), str(changed),
            )  # fmt: skip
            started = time.perf_counter()
            taken = await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/snapshots", {})
            self.samples.add("checkpoint after a rewind", time.perf_counter() - started)
            self.samples.add("checkpoint after a rewind read", taken["read_bytes"])
        await self.call("DELETE", f"/api/v1/sandboxes/{sandbox_id}")

    async def rewind(
        self, sandbox_id: str, snapshot_id: str, changed: str, before: str, registry: Registry
    ) -> None:
        """The sandbox rewound to `snapshot_id` after the agent wrote a file, checked (the file
        gone, `changed` back to the md5sum line `before`), against the raw restore of the
        same bytes."""
        target = f"/workspace/data/{changed}"
        await self.run_in(
            sandbox_id, "sh", "-c",
            f"echo later > /workspace/later.txt && head -c 1000 /dev/urandom > {target}",
        )  # fmt: skip
        sandboxes = self.app[keys.SANDBOXES]
        principal = await self.app[keys.API_KEYS].authenticate(self.headers["X-Session-API-Key"])
        record = await sandboxes.record(sandbox_id)
        principal = principal.model_copy(update={"org_id": record.org_id})
        fetched = Fetched.total
        started = time.perf_counter()
        await sandboxes.rewind(principal, sandbox_id, snapshot_id)
        await self.running(sandbox_id)
        self.samples.add("rewind", time.perf_counter() - started)
        self.samples.add("rewind read", Fetched.total - fetched)
        after = await self.run_in(
            sandbox_id, "sh", "-c", f"test ! -e /workspace/later.txt && md5sum {target}"
        )
        if after != before:
            raise BenchError(f"the rewind did not bring {changed} back")
        self.samples.add(
            "raw restore from the store", await self.raw_restore(snapshot_id, registry)
        )

    async def raw_restore(self, snapshot_id: str, registry: Registry) -> float:
        """Every pack of the snapshot (its manifest's layers: the whole workspace's bytes, sealed)
        fetched from the registry, PACK_FETCHES at once, and written into the workspace of a raw
        container of the spec, started until its /health answers: the bytes a rewind moves and
        the start it makes, without the control plane (nothing is unsealed or unpacked)."""
        record = await self.app[keys.SNAPSHOT_DATA].store.get(snapshot_id)
        if record is None:
            raise BenchError(f"snapshot {snapshot_id} is not in the store")
        started = time.perf_counter()
        manifest = await registry.get_manifest(record.repository, record.manifest_digest)
        if manifest is None:
            raise BenchError(f"snapshot {snapshot_id}: no manifest in the registry")
        digests = [layer["digest"] for layer in manifest["layers"]]
        gate = asyncio.Semaphore(PACK_FETCHES)

        async def fetch(digest: str) -> bytes:
            async with gate:
                return await registry.get_blob(record.repository, digest)

        packs = await asyncio.gather(*(fetch(d) for d in digests))
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for digest, data in zip(digests, packs, strict=True):
                info = tarfile.TarInfo(digest.replace(":", "-"))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        req = self.raw.raw_request()
        volume, container, _, port = await asyncio.to_thread(self.raw.raw_create_start, req)
        try:
            if not await asyncio.to_thread(container.put_archive, "/workspace", archive.getvalue()):
                raise BenchError("the raw restore's archive was refused")
            await self.raw.health(port)
            took = time.perf_counter() - started
        finally:
            await asyncio.to_thread(container.remove, force=True)
            await asyncio.to_thread(volume.remove, force=True)
        self.figures["raw restore bytes"] = sum(len(data) for data in packs)
        return took

    # -- a checkpoint on the message path -------------------------------------------------------

    async def message_path(self) -> None:
        files = MESSAGE_FILES
        sandbox_id = await self.new_sandbox()
        await self.run_in(
            sandbox_id, "python3", "-c", FILL, "/workspace/data", str(files), str(FILE)
        )
        await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/snapshots", {})  # the parent
        service = self.app[keys.SNAPSHOTS]
        record = await self.app[keys.SANDBOXES].record(sandbox_id)
        changed = max(1, MIB // FILE)
        for run in range(self.options.runs):
            await self.run_in(
                sandbox_id, "python3", "-c", CHANGE, "/workspace/data", str(files), str(FILE),
                str(run), str(changed),
            )  # fmt: skip
            captured = asyncio.Event()
            started = time.perf_counter()
            taking = service.begin(record, None, captured)
            await captured.wait()
            self.samples.add("message waits", time.perf_counter() - started)
            await taking
            self.samples.add("whole checkpoint", time.perf_counter() - started)
            self.samples.add("raw pause + unpause", await self.raw_freeze(sandbox_id))
        await self.call("DELETE", f"/api/v1/sandboxes/{sandbox_id}")

    async def raw_freeze(self, sandbox_id: str) -> float:
        def freeze() -> float:
            container = self.container(sandbox_id)
            started = time.perf_counter()
            container.pause()
            container.unpause()
            return time.perf_counter() - started

        return await asyncio.to_thread(freeze)

    async def raw_copy(self, sandbox_id: str, names: list[str], registry: Registry) -> float:
        """The changed files out of the sandbox (tar through docker exec) and into the store as
        one blob: the bytes a checkpoint moves, moved raw."""
        started = time.perf_counter()

        def tar_out() -> bytes:
            result = self.container(sandbox_id).exec_run(
                ["tar", "-C", "/workspace/data", "-cf", "-", *names], user="agent"
            )
            return bytes(result.output)

        data = await asyncio.to_thread(tar_out)
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            if len(archive.getnames()) != len(names):
                raise BenchError("the raw copy missed files")
        await registry.put_blob("bench/raw", data)
        return time.perf_counter() - started

    # -- fork -----------------------------------------------------------------------------------

    async def forks(self) -> None:
        source = await self.new_sandbox()
        await self.run_in(
            source,
            "python3",
            "-c",
            FILL,
            "/workspace/data",
            str(self.options.fork_files),
            str(FILE),
        )
        for count in self.options.counts:
            for _ in range(self.options.runs if count <= 10 else 1):
                started = time.perf_counter()
                forked = await self.call(
                    "POST", f"/api/v1/sandboxes/{source}/fork", {"count": count}
                )
                ids = [s["id"] for s in forked["sandboxes"]]
                await asyncio.gather(*(self.running(i) for i in ids))
                self.samples.add(f"fork {count}", time.perf_counter() - started)
                await asyncio.gather(*(self.call("DELETE", f"/api/v1/sandboxes/{i}") for i in ids))
                await self.call("DELETE", f"/api/v1/snapshots/{forked['snapshot']['id']}")
                self.samples.add(f"raw start {count}", await self.raw_starts(count))
        await self.call("DELETE", f"/api/v1/sandboxes/{source}")

    async def raw_starts(self, count: int) -> float:
        """`count` raw containers of the spec started at once until each /health answers."""
        started = time.perf_counter()

        async def one() -> Any:
            req = self.raw.raw_request()
            volume, container, _, port = await asyncio.to_thread(self.raw.raw_create_start, req)
            await self.raw.health(port)
            return volume, container

        made = await asyncio.gather(*(one() for _ in range(count)))
        took = time.perf_counter() - started
        for volume, container in made:
            await asyncio.to_thread(container.remove, force=True)
            await asyncio.to_thread(volume.remove, force=True)
        return took

    # -- hibernation ----------------------------------------------------------------------------

    async def hibernation(self) -> None:
        service = self.app[keys.SANDBOXES]
        for _ in range(self.options.runs):
            sandbox_id = await self.new_sandbox()
            await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
            container = await asyncio.to_thread(self.container, sandbox_id)
            await asyncio.sleep(0.5)
            self.samples.add("frozen memory", cgroup_bytes(container.id))
            if not await service.hibernate_idle(sandbox_id, "bench"):
                raise BenchError("the sandbox did not hibernate")
            await asyncio.to_thread(container.reload)
            held = 0 if container.status == "exited" else cgroup_bytes(container.id)
            self.samples.add("hibernated memory", held)
            started = time.perf_counter()
            await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/resume")
            await self.running(sandbox_id)
            self.samples.add("resume hibernated", time.perf_counter() - started)
            await self.call("DELETE", f"/api/v1/sandboxes/{sandbox_id}")
            self.samples.add("raw docker start + health", await self.raw_restart())

    async def raw_restart(self) -> float:
        req = self.raw.raw_request()
        volume, container, _, port = await asyncio.to_thread(self.raw.raw_create_start, req)
        await self.raw.health(port)
        await asyncio.to_thread(container.stop, timeout=5)
        started = time.perf_counter()
        await asyncio.to_thread(container.start)
        attrs = await asyncio.to_thread(self.raw.docker.api.inspect_container, container.id)
        spec_port = f"{self.raw.spec.exposed_ports['AGENT_SERVER']}/tcp"
        await self.raw.health(int(attrs["NetworkSettings"]["Ports"][spec_port][0]["HostPort"]))
        took = time.perf_counter() - started
        await asyncio.to_thread(container.remove, force=True)
        await asyncio.to_thread(volume.remove, force=True)
        return took

    # -- the table ------------------------------------------------------------------------------

    def checkpoint_lines(self, p50: Callable[[str], float], missed: list[str]) -> list[str]:
        v = self.samples.values
        lines = [
            f"checkpoint ({self.options.files} files, "
            f"{self.options.files * FILE / MIB:.0f} MiB; first snapshot "
            f"{self.figures['first_snapshot_s']:.1f} s, "
            f"{self.figures['first_snapshot_stored'] / MIB:.0f} MiB stored)",
            f"  after 10 MiB changed: p50 {ms(p50('checkpoint'))} ms (target <= "
            f"{TARGET_CHECKPOINT_S} s), held still p50 {ms(p50('checkpoint held still'))} ms, "
            f"max {ms(max(v['checkpoint held still']))} ms",
            f"  stored / changed bytes: p50 {p50('checkpoint stored ratio'):.3f} (target <= "
            f"{TARGET_STORED_RATIO})",
            f"  raw copy of the changed bytes into the store: p50 "
            f"{ms(p50('raw copy to the store'))} ms; ratio "
            f"{p50('checkpoint') / p50('raw copy to the store'):.2f}x",
        ]
        if "checkpoint after a rewind" in v:
            lines.append(
                f"  first checkpoint after a rewind, 10 MiB changed: p50 "
                f"{ms(p50('checkpoint after a rewind'))} ms (the checkpoint above: "
                f"{ms(p50('checkpoint'))} ms), read p50 "
                f"{p50('checkpoint after a rewind read') / MIB:.1f} MiB of the files"
            )
        if "rewind" in v:
            rewind, raw = p50("rewind"), p50("raw restore from the store")
            lines.append(
                f"  rewind to the checkpoint until RUNNING: p50 {ms(rewind)} ms vs raw restore "
                f"of its {self.figures['raw restore bytes'] / MIB:.0f} MiB of packs from the "
                f"store + start + /health {ms(raw)} ms: {rewind / raw:.2f}x (target <= "
                f"{TARGET_REWIND_RATIO}x)"
            )
            lines.append(
                f"    the rewind read out of the store p50 {p50('rewind read') / MIB:.1f} MiB, "
                f"max {max(v['rewind read']) / MIB:.1f} MiB (the files changed since the "
                "checkpoint; the others come from the sandbox's old workspace)"
            )
            if rewind > TARGET_REWIND_RATIO * raw:
                missed.append("rewind")
        if p50("checkpoint") > TARGET_CHECKPOINT_S:
            missed.append("checkpoint p50")
        if p50("checkpoint stored ratio") > TARGET_STORED_RATIO:
            missed.append("checkpoint stored ratio")
        return lines

    def table(self) -> tuple[list[str], list[str]]:
        v = self.samples.values

        def p50(name: str) -> float:
            return percentile(v.get(name, []), 50)

        missed: list[str] = []
        lines: list[str] = []
        if "checkpoint" in v:
            lines += self.checkpoint_lines(p50, missed)
        forks = [c for c in self.options.counts if f"fork {c}" in v]
        if forks:
            lines.append("fork (100 MiB workspace) until all RUNNING, p50 | raw N starts | ratio")
        for count in forks:
            lines.append(
                f"  {count:3d}: {ms(p50(f'fork {count}')):>9} ms | "
                f"{ms(p50(f'raw start {count}')):>9} ms | "
                f"{p50(f'fork {count}') / p50(f'raw start {count}'):.2f}x"
            )
        if 10 in forks and p50("fork 10") > TARGET_FORK10_S:
            missed.append("fork 10")
        if "message waits" in v:
            waits, whole = p50("message waits"), p50("whole checkpoint")
            raw = p50("raw pause + unpause")
            lines += [
                f"message path ({MESSAGE_FILES} files, "
                f"{MESSAGE_FILES * FILE / MIB:.0f} MiB; 1 MiB changed): the message waits p50 "
                f"{ms(waits)} ms (max {ms(max(v['message waits']))} ms), the whole checkpoint "
                f"{ms(whole)} ms ({waits / whole:.0%} of it waited for)",
                f"  raw docker pause + unpause: p50 {ms(raw)} ms; ratio {waits / raw:.1f}x",
            ]
        if "resume hibernated" in v:
            frozen, hibernated = p50("frozen memory"), p50("hibernated memory")
            resume, raw = p50("resume hibernated"), p50("raw docker start + health")
            lines += [
                f"hibernate: frozen {frozen / MIB:.1f} MiB, hibernated {hibernated / MIB:.1f} MiB "
                f"({hibernated / frozen:.1%}; target <= {TARGET_HIBERNATED_SHARE:.0%})",
                f"  resume p50 {ms(resume)} ms vs raw docker start + /health {ms(raw)} ms: "
                f"{resume / raw:.2f}x (target <= {TARGET_RESUME_RATIO}x)",
            ]
            if hibernated > TARGET_HIBERNATED_SHARE * frozen:
                missed.append("hibernated memory")
            if resume > TARGET_RESUME_RATIO * raw:
                missed.append("hibernated resume")
        missed += [f"phase {n.split()[0]}" for n in self.notes if " failed: " in n]
        return lines, missed


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer files and runs")
    parser.add_argument("--json", type=Path, dest="json_path")
    parser.add_argument(
        "--only",
        choices=PHASES,
        action="append",
        help="run this phase (repeatable); default: all",
    )
    parser.add_argument(
        "--counts",
        type=int,
        nargs="+",
        help="the fork's sizes (default 1 5 10 20; --quick 1 5)",
    )
    parser.add_argument(
        "--starts",
        type=int,
        help="ACS_MAX_CONCURRENT_STARTS (0: no bound; default: the control plane's, 2 per CPU)",
    )
    args = parser.parse_args(argv)
    phases = args.only or list(PHASES)
    if args.quick:
        return Options(2, 1000, 200, args.counts or [1, 5], args.json_path, phases, args.starts)
    counts = args.counts or [1, 5, 10, 20]
    return Options(args.runs, 10_000, 1_000, counts, args.json_path, phases, args.starts)


main = main_of(parse, SnapshotBench, "acs-bench-snap-")

if __name__ == "__main__":
    raise SystemExit(main(None))
