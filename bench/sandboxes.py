"""Sandbox benchmark: the control plane's HTTP API against the docker SDK called directly.

Run with `make bench`, or `.venv/bin/python -m bench.sandboxes [--runs N | --quick]`.
bench/README.md says what is measured and how the ratios are computed.

One process holds everything: a private redis-server, the real app served over real HTTP on
127.0.0.1, an aiohttp client that talks to it, and a docker SDK client for the raw runs.
API and raw runs alternate (API first on even runs, raw first on odd ones), one sandbox at a
time. Every container and volume carries the run's prefix and is removed at the end, also after
an error, Ctrl-C or SIGTERM.

Exit status: 0 when the table was printed (missed targets are marked in it), 1 on an error,
130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import secrets
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from docker.errors import NotFound

from bench.common import (
    STATUS_TIMEOUT,
    BenchError,
    Deployment,
    Samples,
    docker_time,
    main_of,
    ms,
    serve,
)
from controlplane.crypto import load_secret_box
from controlplane.sandboxes import naming
from controlplane.sandboxes import store as store_module
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import SandboxStore
from controlplane.specs.models import AGENT_SERVER
from controlplane.store import keyspace, text

CLIENT_POLL = 0.010
"""The benchmark client's GET interval while waiting for a status (what a real client does)."""
SEARCH_RECORDS = 1000
SEARCH_PAGE = 100
SEARCH_WARMUP = 5
TARGET_RATIO = 1.5
TARGET_SEARCH_MS = 10.0
API_USER = "bench"
SEARCH_USER = "bench-search"


async def create_record(store: SandboxStore, record: SandboxRecord) -> bool:
    """SandboxStore.create without any cap, for both of its signatures.

    create(record, cap) -> bool, or create(record, memory, limits) -> "ok" | which limit.
    """
    create: Any = store.create
    if "limits" in inspect.signature(create).parameters:
        limits = store_module.Limits()  # type: ignore[attr-defined,unused-ignore]  # older versions
        return bool(await create(record, 0, limits) == "ok")
    return bool(await create(record, None))


# -- the benchmark ---------------------------------------------------------------------------


@dataclass
class Options:
    runs: int
    warmup: int
    settle: float
    search_requests: int
    json_path: Path | None


class Bench(Deployment):
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        super().__init__(tmp, redis_url, f"acs-bench-{secrets.token_hex(4)}-")
        self.opt = options
        self.samples = Samples()
        self.api: aiohttp.ClientSession | None = None

    # -- HTTP helpers ----------------------------------------------------------------------

    async def call(
        self, method: str, path: str, key: str, json_body: Any = None
    ) -> tuple[int, Any]:
        assert self.api is not None
        async with self.api.request(
            method, path, json=json_body, headers={"X-Session-API-Key": key}
        ) as resp:
            if resp.content_type != "application/json":
                return resp.status, await resp.text()
            return resp.status, await resp.json()

    async def expect(self, method: str, path: str, key: str, json_body: Any = None) -> Any:
        status, body = await self.call(method, path, key, json_body)
        if status != 200:
            raise BenchError(f"{method} {path} answered {status}: {body}")
        return body

    async def wait_status(self, key: str, sandbox_id: str, want: str) -> tuple[float, Any]:
        """GET until `want` (first GET at once, then every CLIENT_POLL); (perf time, body)."""
        deadline = time.monotonic() + STATUS_TIMEOUT
        while time.monotonic() < deadline:
            t = time.perf_counter()
            body = await self.expect("GET", f"/api/v1/sandboxes/{sandbox_id}", key)
            seen = time.perf_counter()
            self.samples.add("api.get", seen - t)
            if body["status"] == want:
                return seen, body
            if body["status"] in ("ERROR", "MISSING"):
                raise BenchError(f"sandbox {sandbox_id} went {body['status']}: {body['reason']}")
            await asyncio.sleep(CLIENT_POLL)
        raise BenchError(f"sandbox {sandbox_id} not {want} within {STATUS_TIMEOUT:g} s")

    def started_at(self, name: str) -> float:
        t = time.perf_counter()
        state = self.docker.api.inspect_container(name)["State"]
        self.samples.add("docker.inspect", time.perf_counter() - t)
        return docker_time(state["StartedAt"])

    # -- one API run -----------------------------------------------------------------------

    async def api_run(self, key: str, record: bool) -> None:
        add = self.samples.add if record else (lambda _n, _s: None)
        base = "/api/v1/sandboxes"
        wall0 = time.time()
        t0 = time.perf_counter()
        body = await self.expect("POST", base, key, {})
        add("api.post_start", time.perf_counter() - t0)
        if body["status"] != "STARTING":
            raise BenchError(f"start answered {body}")
        sid = body["id"]
        seen, running = await self.wait_status(key, sid, "RUNNING")
        wall_seen = time.time()
        add("api.start", seen - t0)
        # The timeline, read back outside the timed part: Docker's StartedAt, and the RUNNING
        # compare-and-set's timestamp (that transition sets last_activity_at).
        started = await asyncio.to_thread(self.started_at, self.prefix + sid)
        cas = datetime.fromisoformat(running["last_activity_at"]).timestamp()
        add("api.start.pre", started - wall0)
        add("api.start.ready", cas - started)
        add("api.start.notice", wall_seen - cas)
        await asyncio.sleep(self.opt.settle)

        t = time.perf_counter()
        await self.expect("POST", f"{base}/{sid}/pause", key)
        add("api.pause", time.perf_counter() - t)
        await asyncio.sleep(self.opt.settle)

        t = time.perf_counter()
        await self.expect("POST", f"{base}/{sid}/resume", key)
        add("api.resume.post", time.perf_counter() - t)
        seen, _ = await self.wait_status(key, sid, "RUNNING")
        add("api.resume", seen - t)
        await asyncio.sleep(self.opt.settle)

        t = time.perf_counter()
        await self.expect("DELETE", f"{base}/{sid}", key)
        add("api.delete", time.perf_counter() - t)

    # -- one raw run -----------------------------------------------------------------------

    def agent_rss(self, container: Any) -> float | None:
        """VmRSS (MiB) of the agent server: the largest process whose command line holds the
        spec's command, found in /proc inside the container (tini's holds it too, far smaller)."""
        command = shlex.quote(" ".join(self.spec.command or []))
        script = (
            "for p in /proc/[0-9]*; do "
            f"tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qF -- {command} "
            "&& grep VmRSS $p/status; done"
        )
        result = container.exec_run(["sh", "-c", script])
        values = [
            int(line.split()[1]) for line in result.output.decode().splitlines() if "VmRSS" in line
        ]
        return max(values) / 1024 if values else None

    async def raw_run(self, record: bool) -> None:
        add = self.samples.add if record else (lambda _n, _s: None)
        req = self.raw_request()
        wall0 = time.time()
        t0 = time.perf_counter()
        volume, container, started, port = await asyncio.to_thread(self.raw_create_start, req)
        healthy = await self.health(port)
        wall_healthy = time.time()
        add("raw.start", healthy - t0)
        add("raw.boot", healthy - started)
        started_at = await asyncio.to_thread(self.started_at, req.name)
        add("raw.start.pre", started_at - wall0)
        add("raw.start.ready", wall_healthy - started_at)
        await asyncio.sleep(self.opt.settle)
        # Idle memory of the agent right after its boot (untimed; not a duration).
        rss = await asyncio.to_thread(self.agent_rss, container)
        if rss is not None:
            add("raw.agent_rss_mib", rss)

        t = time.perf_counter()
        await asyncio.to_thread(container.pause)
        add("raw.pause", time.perf_counter() - t)
        await asyncio.sleep(self.opt.settle)

        t = time.perf_counter()
        await asyncio.to_thread(container.unpause)
        add("raw.resume", time.perf_counter() - t)
        await asyncio.sleep(self.opt.settle)

        def remove() -> None:
            container.remove(force=True, v=True)
            volume.remove(force=True)

        t = time.perf_counter()
        await asyncio.to_thread(remove)
        add("raw.delete", time.perf_counter() - t)

    # -- phases ----------------------------------------------------------------------------

    async def lifecycle(self) -> None:
        self.api_config = self.config()  # defaults otherwise: reconcile_interval 10 s
        async with serve(self.api_config, self.samples) as served:
            await self.attach(served.app)
            self.api = aiohttp.ClientSession(base_url=served.url)
            self.health_http = aiohttp.ClientSession()
            try:
                key = await self.user_key(API_USER)
                others = await asyncio.to_thread(self.foreign_containers)
                if others:
                    self.notes.append(f"{others} other containers were running at the start")
                total = self.opt.warmup + self.opt.runs
                for i in range(total):
                    record = i >= self.opt.warmup
                    label = (
                        f"run {i - self.opt.warmup + 1}/{self.opt.runs}" if record else "warm-up"
                    )
                    print(f"  {label} ...", end="", flush=True, file=sys.stderr)
                    if i == self.opt.warmup:  # forget what the warm-up recorded on its own
                        for name in ("server:", "api.get", "docker.inspect"):
                            self.samples.drop(name)
                    if i % 2 == 0:
                        await self.api_run(key, record)
                        await self.raw_run(record)
                    else:
                        await self.raw_run(record)
                        await self.api_run(key, record)
                    print(" done", file=sys.stderr)
                await self.components()
                others = await asyncio.to_thread(self.foreign_containers)
                if others:
                    self.notes.append(
                        f"{others} other containers were running on the engine at the end of "
                        "the lifecycle phase: the host may not have been idle"
                    )
                leftover = await self.redis.zcard(keyspace.user_sandboxes(API_USER))
                if leftover:
                    self.notes.append(f"{leftover} API sandbox records left in Redis after deletes")
            finally:
                await self.api.close()
                await self.health_http.close()
                self.api = self.health_http = None

    async def components(self) -> None:
        """Single round trips the API pays on top of the raw path (for the analysis)."""

        def docker_calls() -> None:
            for _ in range(20):
                t = time.perf_counter()
                self.docker.images.get(self.spec.image)
                self.samples.add("docker.image_get", time.perf_counter() - t)
                t = time.perf_counter()
                with contextlib.suppress(NotFound):
                    self.docker.api.inspect_volume(f"{self.prefix}no-such-volume")
                self.samples.add("docker.volume_miss", time.perf_counter() - t)

        await asyncio.to_thread(docker_calls)
        for _ in range(50):
            t = time.perf_counter()
            await self.redis.ping()
            self.samples.add("redis.ping", time.perf_counter() - t)

    async def write_search_records(self) -> None:
        box = load_secret_box(self.secret_key, self.tmp / "data")
        store = SandboxStore(self.redis, box)
        now = datetime.now(UTC)
        # Newest first on the pages: a few RUNNING ones (URLs and key in the view), then a mix.
        cycle = [SandboxStatus.PAUSED] * 3 + [SandboxStatus.MISSING, SandboxStatus.ERROR]
        for i in range(SEARCH_RECORDS):
            status = SandboxStatus.RUNNING if i >= SEARCH_RECORDS - 5 else cycle[i % len(cycle)]
            created = now - timedelta(minutes=SEARCH_RECORDS - i)
            record = SandboxRecord(
                id=naming.new_sandbox_id(),
                owner=SEARCH_USER,
                spec_id=self.spec.id,
                status=status,
                reason="benchmark record" if status in ("ERROR", "MISSING") else None,
                session_api_key=secrets.token_urlsafe(32),
                ports={AGENT_SERVER: 40000 + i},
                created_at=created,
                updated_at=created,
                last_activity_at=created,
            )
            if not await create_record(store, record):
                raise BenchError("could not write a search record")

    async def search_statuses(self) -> dict[str, int]:
        ids = await self.redis.zrange(keyspace.user_sandboxes(SEARCH_USER), 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for sandbox_id in ids:
                pipe.hget(keyspace.sandbox(text(sandbox_id)), "status")
            statuses = await pipe.execute()
        counts: dict[str, int] = {}
        for status in statuses:
            name = text(status) if status else "gone"
            counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items()))

    async def search(self) -> None:
        # Only the start-up sweeps run (before the records exist); none while we measure.
        config = self.config(reconcile_interval=3600, reaper_interval=3600)
        async with serve(config, self.samples) as served:
            self.api = aiohttp.ClientSession(base_url=served.url)
            try:
                await asyncio.sleep(1.0)  # let the start-up sweep finish
                key = await self.user_key(SEARCH_USER)
                await self.write_search_records()
                before = await self.search_statuses()
                path = f"/api/v1/sandboxes/search?limit={SEARCH_PAGE}"
                first = await self.expect("GET", path, key)
                cursor = first["next_page_id"]
                pages = 1
                while pages < SEARCH_RECORDS // SEARCH_PAGE // 2:  # to the 5th page of 10
                    page = await self.expect("GET", f"{path}&page_id={cursor}", key)
                    cursor, pages = page["next_page_id"], pages + 1
                middle = f"{path}&page_id={cursor}"
                for name, url in (("first", path), ("middle", middle)):
                    body = await self.expect("GET", url, key)
                    if len(body["items"]) != SEARCH_PAGE or not body["next_page_id"]:
                        raise BenchError(f"search {name} page: {len(body['items'])} items")
                for _ in range(SEARCH_WARMUP):
                    await self.expect("GET", path, key)
                    await self.expect("GET", middle, key)
                self.samples.drop("server:GET /api/v1/sandboxes/search")
                for _ in range(self.opt.search_requests):
                    for name, url in (("search.first", path), ("search.middle", middle)):
                        t = time.perf_counter()
                        await self.expect("GET", url, key)
                        self.samples.add(name, time.perf_counter() - t)
                after = await self.search_statuses()
                if after != before:
                    self.notes.append(f"search records changed while measured: {before} -> {after}")
            finally:
                await self.api.close()
                self.api = None

    # -- the whole run -----------------------------------------------------------------------

    async def measure(self) -> tuple[list[str], list[str]]:
        self.preflight()
        try:
            print(self.environment(), flush=True)
            print(
                f"lifecycle: {self.opt.runs} runs (+{self.opt.warmup} warm-up), "
                f"prefix {self.prefix}",
                file=sys.stderr,
            )
            await self.lifecycle()
            print("search: 1,000 records ...", file=sys.stderr)
            await self.search()
            lines, missed = table(self.samples, self.opt.runs)
            return [*lines, "", *details(self.samples)], missed
        finally:
            await self.redis.aclose()

    def results(self) -> Any:
        return self.samples.values


# -- report ------------------------------------------------------------------------------------


def table(samples: Samples, runs: int) -> tuple[list[str], list[str]]:
    """The result table's lines and the list of missed targets."""
    s = samples
    boot = s.p("raw.boot", 50)
    missed: list[str] = []
    header = (
        "operation",
        "API p50",
        "API p95",
        "raw p50",
        "raw p95",
        "ratio p50 (API/raw)",
        "target",
        "ok?",
    )
    rows: list[tuple[str, ...]] = []

    def ratio_row(
        label: str, api: tuple[float, float], raw: tuple[float, float], target: bool
    ) -> None:
        ratio = api[0] / raw[0] if raw[0] > 0 else float("nan")
        ok = "-"
        if target:
            ok = "yes" if ratio <= TARGET_RATIO else "NO"
            if ok == "NO":
                missed.append(f"{label}: ratio {ratio:.2f} > {TARGET_RATIO}")
        rows.append(
            (
                label,
                ms(api[0]),
                ms(api[1]),
                ms(raw[0]),
                ms(raw[1]),
                f"{ratio:.2f}",
                f"<= {TARGET_RATIO}" if target else "(info)",
                ok,
            )
        )

    def pair(name: str) -> tuple[float, float]:
        return s.p(name, 50), s.p(name, 95)

    ratio_row("start -> RUNNING (incl. agent boot)", pair("api.start"), pair("raw.start"), False)
    rows.append(
        ("agent server boot (raw)", "-", "-", ms(boot), ms(s.p("raw.boot", 95)), "-", "(info)", "-")
    )
    ratio_row(
        "start excl. agent boot",
        (s.p("api.start", 50) - boot, s.p("api.start", 95) - boot),
        (s.p("raw.start", 50) - boot, s.p("raw.start", 95) - boot),
        True,
    )
    ratio_row("pause", pair("api.pause"), pair("raw.pause"), True)
    ratio_row("resume", pair("api.resume"), pair("raw.resume"), True)
    ratio_row("delete", pair("api.delete"), pair("raw.delete"), False)
    for name, label in (
        ("search.first", "search: first page"),
        ("search.middle", "search: middle page"),
    ):
        p50 = s.p(name, 50)
        ok = "yes" if p50 * 1000 <= TARGET_SEARCH_MS else "NO"
        if ok == "NO":
            missed.append(f"{label}: p50 {p50 * 1000:.1f} ms > {TARGET_SEARCH_MS:g} ms")
        rows.append(
            (
                f"{label} (100 of 1,000)",
                ms(p50),
                ms(s.p(name, 95)),
                "-",
                "-",
                "-",
                f"p50 <= {TARGET_SEARCH_MS:g} ms",
                ok,
            )
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: tuple[str, ...]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:-2], widths[1:-2], strict=True)
        ]
        cells += [row[-2].ljust(widths[-2]), row[-1].ljust(widths[-1])]
        return " | ".join(cells).rstrip()

    lines = [fmt(header), "-+-".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    lines.append(
        f"times in ms; {runs} runs per lifecycle operation and path, "
        f"{samples.count('search.first')} requests per search page"
    )
    return lines, missed


def details(samples: Samples) -> list[str]:
    s = samples

    def p50(name: str) -> str:
        return ms(s.p(name, 50))

    def line(label: str, api: str, raw: str | None = None, note: str = "") -> str:
        out = f"  {label:<36} API {p50(api):>7}"
        if raw is not None:
            out += f"   raw {p50(raw):>7}"
        return out + note

    def two(label: str, client: str, route: str) -> str:
        return f"  {label:<36} {p50(client):>7} / {p50('server:' + route):>7}"

    rss = f"p50 {s.p('raw.agent_rss_mib', 50):.1f} MiB, p95 {s.p('raw.agent_rss_mib', 95):.1f} MiB"
    return [
        f"agent server idle RSS (raw path, VmRSS after its first /health 200 + settle): {rss}",
        "start, decomposed (p50, ms; wall clock against Docker's StartedAt):",
        line("request -> container StartedAt", "api.start.pre", "raw.start.pre"),
        line(
            "StartedAt -> agent ready detected",
            "api.start.ready",
            "raw.start.ready",
            "   (API: its RUNNING compare-and-set; raw: first 200 on /health)",
        ),
        line("RUNNING set -> client sees it", "api.start.notice"),
        "requests, client-observed / inside the server (p50, ms):",
        two("POST /api/v1/sandboxes", "api.post_start", "POST /api/v1/sandboxes"),
        two("GET /api/v1/sandboxes/{id}", "api.get", "GET /api/v1/sandboxes/{sandbox_id}"),
        two("POST .../pause", "api.pause", "POST /api/v1/sandboxes/{sandbox_id}/pause"),
        two("POST .../resume", "api.resume.post", "POST /api/v1/sandboxes/{sandbox_id}/resume"),
        two("DELETE .../{id}", "api.delete", "DELETE /api/v1/sandboxes/{sandbox_id}"),
        two("GET .../search, first page", "search.first", "GET /api/v1/sandboxes/search"),
        "single round trips (p50, ms):",
        f"  docker inspect {p50('docker.inspect')} | "
        f"docker image get {p50('docker.image_get')} | "
        f"docker volume inspect (absent) {p50('docker.volume_miss')} | "
        f"redis PING {p50('redis.ping')}",
    ]


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per operation and path (20)")
    parser.add_argument("--quick", action="store_true", help="5 runs, 50 search requests")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded runs first (1)")
    parser.add_argument(
        "--settle", type=float, default=0.2, help="pause between operations, seconds (0.2)"
    )
    parser.add_argument(
        "--search-requests", type=int, default=100, help="timed requests per search page (100)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    args = parser.parse_args(argv)
    runs = 5 if args.quick else args.runs
    search = 50 if args.quick else args.search_requests
    if runs < 1 or search < 1 or args.warmup < 0 or args.settle < 0:
        parser.error("--runs and --search-requests must be >= 1, --warmup and --settle >= 0")
    return Options(runs, args.warmup, args.settle, search, args.json)


main = main_of(parse_args, Bench, "acs-bench-")

if __name__ == "__main__":
    sys.exit(main(None))
