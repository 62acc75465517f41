"""Warm pool and capacity benchmark: create -> usable and conversation READY, from the warm pool
and cold; host memory per idle and per paused sandbox; how many idle sandboxes admission admits.
Every figure sits next to raw Docker measured in the same run.

Run with `make bench`, or `.venv/bin/python -m bench.warm_pool [--runs N] [--idle N] [--quick]`.
bench/README.md says what is measured and how.

One process holds the control plane (a private redis-server, the real app over real HTTP on
127.0.0.1, the default spec's pool of 2), a scripted fake LLM, and the raw Docker path of
bench/common.py. Pool and cold runs alternate with raw ones; a cold run is the same server
with its pool out of the create path (`SandboxService.pool = None`; the pool is still refilled,
so both kinds run with the same members alive). Before every run the pool is full again, so a
refill never overlaps a timed run. Everything carries the run's prefix and is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import BenchError, main_of, ms
from bench.conversation_harness import Bench as ConversationBench
from bench.conversation_harness import Options as ConversationOptions
from controlplane import keys
from controlplane.sandboxes.pool import WarmPool
from tests.support.fake_llm import FakeLLM

POLL = 0.010
TARGET_CREATE_S = 0.150
TARGET_READY_S = 0.300
TARGET_ADMITTED = 300
BATCH = 20
"""Sandboxes started at once in the memory phase (the engine and 2 cores set the pace)."""
MIB = 1024**2


@dataclass
class Options:
    runs: int
    idle: list[int]
    settle: float
    json_path: Path | None


def cgroup_bytes(container_id: str) -> int:
    """What `docker stats` shows: usage minus inactive page cache (cgroup v1 or v2)."""
    for base in (f"/sys/fs/cgroup/memory/docker/{container_id}", ""):
        if base and Path(base).is_dir():
            usage = int(Path(base, "memory.usage_in_bytes").read_text())
            stat = dict(line.split() for line in Path(base, "memory.stat").read_text().splitlines())
            return usage - int(stat.get("total_inactive_file", 0))
    scope = Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope")
    stat = dict(line.split() for line in (scope / "memory.stat").read_text().splitlines())
    return int((scope / "memory.current").read_text()) - int(stat.get("inactive_file", 0))


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise BenchError("no MemAvailable in /proc/meminfo")


class PoolBench(ConversationBench):
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        quiet = ConversationOptions(0, 0, options.settle, 0, 0, 1, None)
        super().__init__(quiet, tmp, redis_url)
        self.popt = options
        self.pool: WarmPool | None = None
        self.app: Any = None
        self.url = ""
        self.figures: dict[str, Any] = {}

    # -- the whole run (run_main) ---------------------------------------------------------------

    async def measure(self) -> tuple[list[str], list[str]]:
        try:
            print(self.raw.environment(), flush=True)
            print(f"prefix {self.prefix}", file=sys.stderr)
            await self.run()
            return table(self)
        finally:
            self.notes.extend(n for n in self.raw.notes if n not in self.notes)
            await self.redis.aclose()

    def results(self) -> Any:
        return {**self.samples.values, **self.figures}

    # -- helpers ------------------------------------------------------------------------------

    def pool_on(self, on: bool) -> None:
        self.app[keys.SANDBOXES].pool = self.pool if on else None

    async def pool_full(self) -> None:
        """Untimed: wait until every member of the default spec is ready (and none booting)."""
        assert self.pool is not None
        spec = self.raw.spec
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            members = [r for r, _ in await self.pool.store.members() if r.spec_id == spec.id]
            ready = await self.pool.store.ready_ids(spec.id)
            if len(ready) >= self.pool.size(spec) and len(members) == len(ready):
                return
            await asyncio.sleep(0.05)
        # Noted, not fatal: the next pool run may then start cold (and says so).
        states = sorted(f"{r.status.value}:{r.reason}" for r, _ in await self.pool.store.members())
        self.raw.notes.append(f"the pool did not refill within 120 s ({states})")

    async def usable(self, url: str) -> float:
        assert self.agent_http is not None
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.agent_http.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return time.perf_counter()
            await asyncio.sleep(POLL)

    async def until_running(self, sandbox_id: str, body: Any) -> Any:
        while body["status"] != "RUNNING":
            if body["status"] in ("ERROR", "MISSING"):
                raise BenchError(f"sandbox {sandbox_id}: {body['status']} {body['reason']}")
            await asyncio.sleep(POLL)
            body = await self.expect("GET", f"/api/v1/sandboxes/{sandbox_id}")
        return body

    # -- create -> usable -----------------------------------------------------------------------

    async def api_create(self, kind: str) -> None:
        await self.pool_full()
        self.pool_on(kind == "pool")
        try:
            t0 = time.perf_counter()
            body = await self.expect("POST", "/api/v1/sandboxes", {})
            t_post = time.perf_counter()
            claimed = body["status"] == "RUNNING"
            body = await self.until_running(body["id"], body)
            t_running = time.perf_counter()
            usable = await self.usable(body["exposed_urls"][0]["url"])
        finally:
            self.pool_on(True)
        if kind == "pool" and not claimed:
            self.raw.notes.append("a pool create found the pool empty (started cold)")
        self.samples.add(f"{kind}.post", t_post - t0)
        self.samples.add(f"{kind}.running", t_running - t0)
        self.samples.add(f"{kind}.usable", usable - t0)
        await self.expect("DELETE", f"/api/v1/sandboxes/{body['id']}")
        await asyncio.sleep(self.opt.settle)

    async def raw_create_usable(self) -> None:
        raw, t0, t_docker, healthy = await self.raw_create()
        self.samples.add("raw.running", t_docker - t0)
        self.samples.add("raw.usable", healthy - t0)
        await self.raw_remove(raw)
        await asyncio.sleep(self.opt.settle)

    async def raw_warm_usable(self, port: int) -> None:
        """The floor of any pool: a container already running, one /health away."""
        t0 = time.perf_counter()
        await self.usable(f"http://127.0.0.1:{port}")
        self.samples.add("raw_warm.usable", time.perf_counter() - t0)

    # -- conversation READY ---------------------------------------------------------------------

    async def api_conversation(self, kind: str) -> None:
        await self.pool_full()
        self.pool_on(kind == "pool")
        try:
            t0 = time.perf_counter()
            task = await self.api_start(None, None)
            self.samples.add(f"{kind}.ready", time.perf_counter() - t0)
        finally:
            self.pool_on(True)
        cid = task["app_conversation_id"]
        await self.wait_finished(cid)
        await self.expect("DELETE", f"/api/v1/app-conversations/{cid}")
        await asyncio.sleep(self.opt.settle)

    async def raw_conversation_ready(self, warm: Any) -> None:
        raw, t0, _t_docker, healthy = await self.raw_create()
        cid, post = await self.raw_conversation(raw)
        self.samples.add("raw.ready", healthy - t0 + post)
        await self.raw_finish(raw, cid)
        await self.raw_remove(raw)
        cid, post = await self.raw_conversation(warm)
        self.samples.add("raw_warm.ready", post)
        await self.raw_finish(warm, cid)
        await asyncio.sleep(self.opt.settle)

    async def alternate(self, label: str, steps: list[Callable[[], Awaitable[None]]]) -> None:
        print(f"{label}: {self.popt.runs} runs", file=sys.stderr)
        kept = {name: len(values) for name, values in self.samples.values.items()}
        for i in range(self.popt.runs + 1):  # the first round is a warm-up
            order = steps[i % len(steps) :] + steps[: i % len(steps)]
            for step in order:
                await step()
            if i == 0:  # forget the warm-up's samples, keep earlier phases'
                for name, values in self.samples.values.items():
                    del values[kept.get(name, 0) :]
            print(f"  run {i}/{self.popt.runs} done", file=sys.stderr)

    # -- memory and admission -------------------------------------------------------------------

    async def api_idle(self, count: int) -> None:
        self.pool_on(False)
        ids: list[str] = []
        try:
            before = mem_available()
            for start in range(0, count, BATCH):
                bodies = await asyncio.gather(
                    *(
                        self.call("POST", "/api/v1/sandboxes", {})
                        for _ in range(min(BATCH, count - start))
                    )
                )
                refused = [b for status, b in bodies if status != 200]
                if refused:
                    self.figures[f"api_{count}_refused"] = refused[0]
                    raise BenchError(f"sandbox {start + 1} of {count} refused: {refused[0]}")
                batch = [b["id"] for _s, b in bodies]
                ids += batch
                await asyncio.gather(*(self.until_running(i, {"status": "?"}) for i in batch))
            await self.memory_of(f"api.{count}", ids, before)
            await self.batched([partial(self.api_pause, i) for i in ids])
            await self.memory_of(f"api_paused.{count}", ids, before)
        finally:
            self.pool_on(True)
            await self.batched(
                [partial(self.call, "DELETE", f"/api/v1/sandboxes/{i}") for i in ids]
            )

    async def raw_idle(self, count: int) -> None:
        made: list[Any] = []
        try:
            before = mem_available()
            for start in range(0, count, BATCH):
                batch = await asyncio.gather(
                    *(self.raw_create() for _ in range(min(BATCH, count - start)))
                )
                made += [raw for raw, *_ in batch]
            names = [r.container.name for r in made]
            await self.memory_of(f"raw.{count}", names, before)
            await self.batched([partial(self.raw_pause, r) for r in made])
            await self.memory_of(f"raw_paused.{count}", names, before)
        finally:
            await self.batched([partial(self.raw_remove, r) for r in made])

    async def api_pause(self, sandbox_id: str) -> None:
        status, body = await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
        if status != 200:
            self.raw.notes.append(f"API pause answered {status}: {str(body)[-80:]}")

    async def raw_pause(self, raw: Any) -> None:
        """`docker pause`; under load the engine's freezer can fail ("unable to freeze"): that
        container is measured running and the failure noted."""
        try:
            await asyncio.to_thread(raw.container.pause)
        except Exception as exc:
            self.raw.notes.append(f"raw pause failed: {str(exc)[-80:]}")

    async def batched(self, calls: list[Callable[[], Awaitable[Any]]]) -> None:
        for start in range(0, len(calls), BATCH):
            await asyncio.gather(*(c() for c in calls[start : start + BATCH]))

    async def memory_of(self, name: str, ids: list[str], before: int) -> None:
        await asyncio.sleep(max(self.opt.settle, 5.0))  # let boot-time allocations settle
        prefix = self.prefix

        def read() -> int:
            total = 0
            for sandbox_id in ids:
                full = sandbox_id if sandbox_id.startswith(prefix) else f"{prefix}{sandbox_id}"
                total += cgroup_bytes(self.raw.docker.api.inspect_container(full)["Id"])
            return total

        total = await asyncio.to_thread(read)
        self.figures[f"{name}.cgroup_mib"] = total / len(ids) / MIB
        self.figures[f"{name}.host_mib"] = (before - mem_available()) / len(ids) / MIB
        print(f"  {name}: {total / len(ids) / MIB:.1f} MiB per sandbox (cgroup)", file=sys.stderr)

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> None:
        self.raw.preflight()
        # The default spec's own pool (warm_pool unset), no per-user caps.
        async with self.served_with_model(
            warm_pool=None, max_running_per_user=0, max_sandboxes_per_user=0
        ) as (served, fake):
            self.app = served.app
            self.url = served.url
            self.pool = served.app[keys.POOL]
            await self.pool_phases(fake)

    async def pool_phases(self, fake: FakeLLM) -> None:
        try:
            await self.open_as(self.url, fake, "bench-pool")
            limits = await self.app[keys.SANDBOXES].limits()
            reservation = self.raw.spec.resources.reservation_bytes
            self.figures["capacity_bytes"] = limits.memory_capacity
            self.figures["admits"] = (limits.memory_capacity or 0) // reservation
            if self.popt.runs > 0:
                warm, *_ = await self.raw_create()
                try:
                    await self.alternate(
                        "create -> usable",
                        [
                            lambda: self.api_create("pool"),
                            lambda: self.api_create("cold"),
                            self.raw_create_usable,
                            lambda: self.raw_warm_usable(warm.port),
                        ],
                    )
                    await self.api_conversation("pool")  # captures the agent body for the raw path
                    await self.alternate(
                        "conversation READY",
                        [
                            lambda: self.api_conversation("pool"),
                            lambda: self.api_conversation("cold"),
                            lambda: self.raw_conversation_ready(warm),
                        ],
                    )
                finally:
                    await self.raw_remove(warm)
            for count in self.popt.idle:
                print(f"memory: {count} idle, then paused sandboxes", file=sys.stderr)
                try:
                    await self.api_idle(count)
                    await self.raw_idle(count)
                except Exception as exc:  # keep what the earlier phases measured
                    self.raw.notes.append(f"{count} idle sandboxes: {exc}")
                    print(f"  failed: {exc}", file=sys.stderr)
        finally:
            await self.close_sessions()


def table(bench: PoolBench) -> tuple[list[str], list[str]]:
    s, r = bench.samples, bench.figures
    missed: list[str] = []

    def row(label: str, api: str, raw: str, target: float | None = None) -> str:
        a, b = s.p(api, 50), s.p(raw, 50)
        ok = "-"
        if target is not None and math.isnan(a):  # the phase did not run (--runs 0)
            ok = "not run"
        elif target is not None:
            ok = "yes" if a <= target else "NO"
            if ok == "NO":
                missed.append(f"{label}: p50 {ms(a)} ms > {target * 1000:g} ms")
        return (
            f"| {label} | {ms(a)} | {ms(s.p(api, 95))} | {ms(b)} | {ms(s.p(raw, 95))} "
            f"| {a / b:.2f} | {'-' if target is None else f'<= {target * 1000:g} ms'} | {ok} |"
        )

    lines = [
        "| operation (ms) | API p50 | API p95 | raw p50 | raw p95 | ratio p50 | target | ok? |",
        "|---|---|---|---|---|---|---|---|",
        row(
            "create -> RUNNING, pool (raw: create+start+/health)",
            "pool.running",
            "raw.usable",
            TARGET_CREATE_S,
        ),
        row(
            "create -> usable, pool (raw: a running container's /health)",
            "pool.usable",
            "raw_warm.usable",
        ),
        row("create -> RUNNING, cold (raw: create+start+/health)", "cold.running", "raw.usable"),
        row("create -> usable, cold (raw: create+start+/health)", "cold.usable", "raw.usable"),
        row(
            "conversation READY, pool (raw: a running agent's POST)",
            "pool.ready",
            "raw_warm.ready",
            TARGET_READY_S,
        ),
        row("conversation READY, pool (raw: cold container + POST)", "pool.ready", "raw.ready"),
        row("conversation READY, cold (raw: cold container + POST)", "cold.ready", "raw.ready"),
    ]
    lines += [
        "",
        "| sandboxes | state | API MiB each (cgroup) | raw MiB each (cgroup) | ratio "
        "| API MiB each (host MemAvailable) | raw MiB each (host) |",
        "|---|---|---|---|---|---|---|",
    ]
    for count in bench.popt.idle:
        for state, a, b in (("idle", "api", "raw"), ("paused", "api_paused", "raw_paused")):
            ca, cb = r.get(f"{a}.{count}.cgroup_mib"), r.get(f"{b}.{count}.cgroup_mib")
            if ca is None or cb is None:
                continue
            lines.append(
                f"| {count} | {state} | {ca:.1f} | {cb:.1f} | {ca / cb:.2f} "
                f"| {r[f'{a}.{count}.host_mib']:.1f} | {r[f'{b}.{count}.host_mib']:.1f} |"
            )
    admits = int(r.get("admits", 0))
    most = max((c for c in bench.popt.idle if f"api.{c}.cgroup_mib" in r), default=0)
    ok = admits >= TARGET_ADMITTED
    if not ok:
        missed.append(f"admission: {admits} idle sandboxes < {TARGET_ADMITTED}")
    lines += [
        "",
        f"admission: capacity {r.get('capacity_bytes', 0) / 1024**3:.1f} GiB / reservation "
        f"{bench.raw.spec.resources.reservation_bytes // MIB} MiB = {admits} idle sandboxes of "
        f"the default spec (target >= {TARGET_ADMITTED}: {'yes' if ok else 'NO'}); "
        f"{most} started and held RUNNING through the API in this run",
    ]
    return lines, missed


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=15, help="timed runs per case (15; 0: memory only)"
    )
    parser.add_argument(
        "--idle", type=str, default="100", help="idle sandbox counts, comma-separated (100)"
    )
    parser.add_argument("--quick", action="store_true", help="5 runs, 20 idle sandboxes")
    parser.add_argument("--settle", type=float, default=0.2, help="pause between runs, s (0.2)")
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    args = parser.parse_args(argv)
    idle = [20] if args.quick else [int(n) for n in args.idle.split(",") if n.strip() != "0"]
    runs = 5 if args.quick else args.runs
    if runs < 0 or any(n < 1 for n in idle):
        parser.error("--runs must be >= 0 (0: memory only), --idle counts >= 1")
    return Options(runs, idle, args.settle, args.json)


main = main_of(parse_args, PoolBench, "acs-bench-pool-")

if __name__ == "__main__":
    sys.exit(main(None))
