"""The launch path under load: does a short request wait behind sandbox starts?

Run with `make bench`, or `.venv/bin/python -m bench.launch_load [--repeats N] [--levels 5,20,50]
[--flights N]` (`--levels ''` measures only the in-flight phase).

The control plane runs as its own process (`controlplane serve`, on a private redis-server), so
the request latencies measured are its own; this process is the client and the raw baseline.
For each level N, alternately:
- API: N concurrent POST /api/v1/sandboxes, then, until all N are RUNNING, an unrelated
  GET /api/settings every 20 ms, timed;
- raw: N concurrent starts made directly with the docker SDK (volume, create, start, /health
  polled every 20 ms: the same containers, on the same network), with the same GET timed against
  the (idle) control plane.
Then, `--flights` times: one more POST /api/v1/sandboxes right after 20 concurrent ones were
answered (against a POST with nothing in flight at all) and a pause of a RUNNING sandbox through
the API (against `docker pause` of a running raw container with 20 raw starts in flight).

Targets (issue 12): GET p95 during API starts <= 1.2x its p95 during raw starts at 20 and 50;
POST with 20 in flight <= 1.5x idle; API pause with 20 in flight <= 1.5x the raw pause.
The machine may be shared: run it more than once. Exit 0 when the table was printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import docker

from bench.common import REPO, percentile, process_cpu, publish_host, serve_env
from controlplane.config import load_config
from controlplane.sandboxes import naming
from controlplane.sandboxes.launcher import network_policy, sandbox_request
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER
from drivers.docker.containers import container_request, create_container
from drivers.docker.egress import Attachment, network_name
from drivers.egress import HOST_GATEWAY
from tests.support.docker_fixtures import remove_matching
from tests.support.live_server import free_port
from tests.support.redis_server import RedisServer

PROBE_EVERY = 0.02
IN_FLIGHT = 20
SETTLE = 0.3  # seconds after a phase, so that its tail (deletes, events) is not measured


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


class LaunchLoad:
    def __init__(self, tmp: Path, server_env: dict[str, str]) -> None:
        self.tmp = tmp
        self.server_env = server_env
        self.prefix = f"acs-bench-{secrets.token_hex(3)}-"
        self.raw_prefix = f"{self.prefix}raw-"
        self.key = "bench-" + secrets.token_hex(12)
        self.tag = os.environ.get("ACS_IMAGE_TAG") or None
        self.spec = SpecCatalog.load(REPO / "specs", self.tag).default
        self.docker = docker.from_env(timeout=120)
        self.redis = RedisServer(tmp / "redis")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None
        self.attachment: Attachment | None = None
        self.own_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-quick")

    # -- the server --------------------------------------------------------------------

    async def start_server(self) -> None:
        self.redis.start()
        env = serve_env(
            redis_url=self.redis.url,
            bootstrap_key=self.key,
            prefix=self.prefix,
            data_dir=self.tmp / "data",
            ACS_RATE_LIMIT_PER_MINUTE="0",
            ACS_MAX_RUNNING_PER_USER="0",
            ACS_MAX_SANDBOXES_PER_USER="0",
            ACS_WARM_POOL="0",
            ACS_START_TIMEOUT="120",
        )
        if self.tag:
            env["ACS_IMAGE_TAG"] = self.tag
        env.update(self.server_env)
        binary = Path(sys.executable).parent / "controlplane"
        self.process = await asyncio.create_subprocess_exec(
            str(binary),
            *("serve", "--host", "127.0.0.1", "--port", str(self.port)),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200))
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.get(f"{self.url}/health") as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError("the control plane did not start")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()
        self.redis.stop()
        await asyncio.to_thread(self.cleanup)

    def cleanup(self) -> None:
        # The shared clean-up also removes the sandbox network's host firewall rules, which
        # outlive a network removed on its own (a stale `acs_out_*` table per run otherwise).
        remove_matching(self.docker, self.prefix)

    # -- API helpers -------------------------------------------------------------------

    async def call(self, method: str, path: str) -> tuple[int, Any, float]:
        assert self.http is not None
        t = time.perf_counter()
        async with self.http.request(
            method, self.url + path, headers={"X-Session-API-Key": self.key}
        ) as resp:
            body = await resp.json(content_type=None)
            return resp.status, body, time.perf_counter() - t

    async def create(self) -> tuple[str, float]:
        status, body, took = await self.call("POST", "/api/v1/sandboxes")
        if status != 200:
            raise RuntimeError(f"POST /api/v1/sandboxes: {status} {body}")
        return body["id"], took

    async def statuses(self, ids: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for n in range(0, len(ids), 100):
            chunk = ids[n : n + 100]
            query = "&".join(f"id={i}" for i in chunk)
            _, body, _ = await self.call("GET", f"/api/v1/sandboxes?{query}")
            found.update({b["id"]: b["status"] for b in body if b})
        return found

    async def wait_running(self, ids: list[str], within: float = 300) -> None:
        deadline = time.monotonic() + within
        while True:
            states = await self.statuses(ids)
            bad = [s for s in states.values() if s in ("ERROR", "MISSING")]
            if bad:
                raise RuntimeError(f"starts failed: {bad}")
            if all(s == "RUNNING" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"not RUNNING in {within} s: {states}")
            await asyncio.sleep(0.25)

    async def delete(self, ids: list[str]) -> None:
        await asyncio.gather(*(self.call("DELETE", f"/api/v1/sandboxes/{i}") for i in ids))

    async def sample_while(self, busy: Awaitable[Any]) -> list[float]:
        """Time GET /api/settings every PROBE_EVERY until `busy` is done."""
        task = asyncio.ensure_future(busy)
        samples: list[float] = []
        while not task.done():
            _, _, took = await self.call("GET", "/api/settings")
            samples.append(took)
            await asyncio.sleep(PROBE_EVERY)
        await task
        return samples

    # -- raw starts --------------------------------------------------------------------

    def raw_start(self) -> tuple[str, int]:
        now = datetime.now(UTC)
        record = SandboxRecord(
            id=naming.new_sandbox_id(),
            owner="bench",
            spec_id=self.spec.id,
            status=SandboxStatus.STARTING,
            session_api_key=secrets.token_urlsafe(32),
            created_at=now,
            updated_at=now,
            last_activity_at=now,
        )
        config = load_config(
            {}, container_prefix=self.raw_prefix, data_dir=self.tmp / "data", image_tag=self.tag
        )
        request = sandbox_request(config, record, self.spec)
        req = container_request(request, self.raw_prefix, publish_host(config), self.attachment)
        self.docker.volumes.create(name=req.volume, labels=req.labels)
        container_id = create_container(self.docker, req)  # the driver's own create
        self.docker.api.start(container_id)
        attrs = self.docker.api.inspect_container(container_id)
        port = self.spec.exposed_ports[AGENT_SERVER]
        return req.name, int(attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]["HostPort"])

    async def raw_up(self) -> str:
        assert self.http is not None
        name, port = await asyncio.to_thread(self.raw_start)
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        return name
            await asyncio.sleep(PROBE_EVERY)

    def raw_remove(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(docker.errors.NotFound):
                self.docker.api.remove_container(name, force=True, v=True)
            with contextlib.suppress(docker.errors.NotFound):
                self.docker.api.remove_volume(f"{name}-workspace", force=True)

    async def timed_thread(self, fn: Callable[[], Any]) -> float:
        """Run `fn` in a thread of its own: never queued behind the raw starts' threads."""
        t = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(self.own_thread, fn)
        return time.perf_counter() - t

    # -- the phases --------------------------------------------------------------------

    async def prepare(self) -> None:
        """One API sandbox first: it makes the spec's network, which raw starts join too."""
        sandbox_id, _ = await self.create()
        await self.wait_running([sandbox_id])
        net = self.docker.networks.get(network_name(self.prefix, network_policy(self.spec)))
        gateway = str(net.attrs["IPAM"]["Config"][0]["Gateway"])
        self.attachment = Attachment(str(net.name), gateway, {HOST_GATEWAY: gateway})
        await self.delete([sandbox_id])

    def server_cpu(self) -> float:
        """CPU seconds the control plane's process has used (user + system)."""
        assert self.process is not None
        return process_cpu(self.process.pid)

    async def api_level(self, n: int) -> tuple[list[float], float]:
        """The GET samples, and the server's CPU seconds per start (the GETs' share included)."""

        async def starts() -> None:
            ids = [i for i, _ in await asyncio.gather(*(self.create() for _ in range(n)))]
            await self.wait_running(ids)
            created.extend(ids)

        created: list[str] = []
        before = self.server_cpu()
        samples = await self.sample_while(starts())
        cpu = (self.server_cpu() - before) / n
        await self.delete(created)
        return samples, cpu

    async def raw_level(self, n: int) -> list[float]:
        names: list[str] = []

        async def starts() -> None:
            names.extend(await asyncio.gather(*(self.raw_up() for _ in range(n))))

        samples = await self.sample_while(starts())
        await asyncio.to_thread(self.raw_remove, names)
        return samples

    async def idle_post(self) -> float:
        """One POST with nothing in flight: the previous sandbox is RUNNING and has settled."""
        sandbox_id, took = await self.create()
        await self.wait_running([sandbox_id])
        await self.delete([sandbox_id])
        await asyncio.sleep(SETTLE)
        return took

    async def in_flight(self) -> dict[str, float]:
        """POST and pause with IN_FLIGHT starts in flight, API and raw."""
        out: dict[str, float] = {"post.idle": await self.idle_post()}
        target, _ = await self.create()
        await self.wait_running([target])
        await asyncio.sleep(SETTLE)
        burst = time.perf_counter()
        busy = [i for i, _ in await asyncio.gather(*(self.create() for _ in range(IN_FLIGHT)))]
        extra, out["post.loaded"] = await self.create()
        # The raw pause is sent as long after its burst began as this one is after the API's:
        # the engine's answer depends on how far its creates have got.
        out["pause.after"] = time.perf_counter() - burst
        status, _, out["pause.loaded"] = await self.call(
            "POST", f"/api/v1/sandboxes/{target}/pause"
        )
        if status != 200:
            raise RuntimeError(f"pause: {status}")
        await self.wait_running([*busy, extra])
        await self.delete([*busy, extra, target])
        await asyncio.sleep(SETTLE)

        victim = await self.raw_up()
        flight = asyncio.gather(*(self.raw_up() for _ in range(IN_FLIGHT)))
        await asyncio.sleep(out["pause.after"])
        out["raw_pause.loaded"] = await self.timed_thread(lambda: self.docker.api.pause(victim))
        others = await flight
        await asyncio.to_thread(self.docker.api.unpause, victim)
        out["raw_pause.idle"] = await self.timed_thread(lambda: self.docker.api.pause(victim))
        await asyncio.to_thread(self.raw_remove, [victim, *others])
        return out


async def run(
    levels: list[int], repeats: int, flight_count: int, server_env: dict[str, str]
) -> int:
    # Raw starts all run at once, as the control plane's do (no queue of the bench's own).
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=128))
    with tempfile.TemporaryDirectory(prefix="acs-launch-load-") as tmp:
        bench = LaunchLoad(Path(tmp), server_env)
        try:
            await bench.start_server()
            await bench.prepare()
            idle = [(await bench.call("GET", "/api/settings"))[2] for _ in range(100)]
            api: dict[int, list[float]] = {n: [] for n in levels}
            raw: dict[int, list[float]] = {n: [] for n in levels}
            flights: list[dict[str, float]] = []
            cpu: dict[int, list[float]] = {n: [] for n in levels}
            for r in range(repeats):
                for n in levels:
                    for name in ("api", "raw") if r % 2 == 0 else ("raw", "api"):
                        print(f"repeat {r + 1}/{repeats}: {n} {name} starts", file=sys.stderr)
                        if name == "api":
                            samples, per_start = await bench.api_level(n)
                            api[n].extend(samples)
                            cpu[n].append(per_start)
                        else:
                            raw[n].extend(await bench.raw_level(n))
            for f in range(flight_count):
                print(f"{IN_FLIGHT} in flight: {f + 1}/{flight_count}", file=sys.stderr)
                flights.append(await bench.in_flight())
        finally:
            await bench.stop()
    print(f"GET /api/settings idle: p50 {ms(percentile(idle, 50))}, p95 {ms(percentile(idle, 95))}")
    print(
        "concurrent starts | GET during API starts p50 / p95 | during raw starts p50 / p95"
        " | p95 ratio"
    )
    for n in levels:
        a, b = api[n], raw[n]
        ratio = percentile(a, 95) / percentile(b, 95)
        mark = "" if n < 20 else (" ok" if ratio <= 1.2 else " MISSED (target <= 1.2)")
        print(
            f"{n:>17} | {ms(percentile(a, 50))} / {ms(percentile(a, 95))} (n={len(a)}) | "
            f"{ms(percentile(b, 50))} / {ms(percentile(b, 95))} (n={len(b)}) | {ratio:.2f}x{mark}"
        )
    for n in levels:
        print(
            f"control plane CPU per start at {n} concurrent (its GETs' share included): "
            f"{ms(statistics.median(cpu[n]))} (median of {len(cpu[n])})"
        )

    def med(key: str) -> float:
        return statistics.median(f[key] for f in flights)

    def each(key: str) -> str:
        return ", ".join(f"{f[key] * 1000:.1f}" for f in flights)

    if flights:
        post = med("post.loaded") / med("post.idle")
        pause = med("pause.loaded") / med("raw_pause.loaded")
        print(
            f"POST /api/v1/sandboxes with {IN_FLIGHT} starts in flight: {ms(med('post.loaded'))} "
            f"vs idle {ms(med('post.idle'))}: {post:.2f}x {'ok' if post <= 1.5 else 'MISSED'} "
            f"(target <= 1.5x; medians of {len(flights)})"
        )
        print(f"  POST samples, ms: in flight {each('post.loaded')}; idle {each('post.idle')}")
        print(
            f"pause with {IN_FLIGHT} starts in flight: API {ms(med('pause.loaded'))} vs raw "
            f"{ms(med('raw_pause.loaded'))} (raw idle {ms(med('raw_pause.idle'))}): {pause:.2f}x "
            f"{'ok' if pause <= 1.5 else 'MISSED'} (target <= 1.5x)"
        )
        print(f"  pause samples, ms: API {each('pause.loaded')}; raw {each('raw_pause.loaded')}")
        print(f"  each pause sent this long after its burst began, ms: {each('pause.after')}")
    print(
        f"load average at the end: {os.getloadavg()[0]:.2f} (a shared machine inflates both sides)"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="5,20,50")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--flights", type=int, default=6, help="times the 20-in-flight phase is measured"
    )
    parser.add_argument(
        "--server-env", action="append", default=[], help="ACS_X=value for the server, repeatable"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    server_env = dict(item.split("=", 1) for item in args.server_env)
    if server_env:
        print(f"server settings: {server_env}")
    return asyncio.run(run(levels, args.repeats, args.flights, server_env))


if __name__ == "__main__":
    sys.exit(main())
