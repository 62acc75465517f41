"""The control plane's CPU per request of a burst's kinds (issue 30, item 1): a claim from the
warm pool (POST /api/v1/sandboxes), a user's status poll (GET /api/v1/sandboxes?id=…, its
sandboxes in one batch) and a first command sent through the sandbox proxy
(/sandboxes/{id}/proxy/{port}/…), each sent one at a time so that the server's CPU over a
loop, read from /proc/<pid>/stat, divided by the requests, is that kind's cost.

Run with `.venv/bin/python -m bench.request_cpu` (a pool of 20, 2 users); `--control-plane PATH`
(repeatable) measures each `controlplane` given in turn, alternating for `--rounds` rounds, e.g.
main's beside a branch's: each round every control plane in its own process on the run's
private Redis (flushed between them), with the same pool, users and loops. The server's idle
CPU (its pool refiller, reconciler and sweeps) is measured over `--idle` seconds before the loops
and subtracted. The raw figure beside it: the same first command sent straight to the agent
server (no control plane), timed by the client. bench/README.md says what the figures mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.burst import EXPECTED, BurstBench, Server
from bench.common import (
    BenchError,
    Deployment,
    Samples,
    main_of,
    percentile,
    process_cpu,
    py_spy,
    py_spy_stop,
)
from controlplane.store import keyspace


@dataclass
class Options:
    pool: int
    users: int
    polls: int
    commands: int
    rounds: int
    idle: float
    json_path: Path | None
    control_planes: list[Path] = field(default_factory=list)
    profile: Path | None = None
    py_spy: Path | None = None  # each loop sampled by py-spy into this directory


@dataclass
class Figures:
    """One control plane's CPU per request of each kind, in ms, for one round."""

    label: str
    claim: float
    poll: float
    proxied: float
    idle_per_s: float
    claim_wall: float
    poll_wall: float
    proxied_wall: float
    direct_wall: float
    redis_claim: float = 0.0  # redis-server's CPU per claim, ms
    redis_poll: float = 0.0  # and per poll


class RequestCpuBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.opt = options
        self.tmp = tmp
        self.deploy = Deployment(tmp, redis_url, f"acs-bench-cpu-{time.time_ns() % 10**6}-")
        self.notes = self.deploy.notes
        self.samples = Samples()
        self.rows: list[Figures] = []

    def results(self) -> Any:
        return {"rows": [r.__dict__ for r in self.rows], **self.samples.values}

    def remove_everything(self) -> int:
        return self.deploy.remove_everything()

    def close(self) -> None:
        self.deploy.close()

    async def measure(self) -> tuple[list[str], list[str]]:
        self.deploy.preflight()
        print(self.deploy.environment(), flush=True)
        binaries: list[Path | None] = list(self.opt.control_planes) or [None]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            self.deploy.health_http = http
            try:
                for n in range(self.opt.rounds):
                    for binary in binaries:
                        self.rows.append(await self.one(http, binary, n))
            finally:
                await self.deploy.redis.aclose()
        return self.table(), []

    @staticmethod
    def label(binary: Path | None) -> str:
        """`<worktree> <commit>` of the control plane `binary` runs (<worktree>/.venv/bin/…)."""
        tree = (binary or Path(sys.executable).parent / "controlplane").resolve().parents[2]
        commit = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return f"{tree.name} {commit or '?'}"

    async def pool_full(self, http: aiohttp.ClientSession, url: str) -> None:
        """Until the pool's members of the default spec are all ready (untimed)."""
        headers = {"X-Session-API-Key": self.deploy.bootstrap_key}
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            async with http.get(f"{url}/api/v1/sandbox-pool", headers=headers) as resp:
                view = await resp.json()
            spec = next(s for s in view["specs"] if s["spec_id"] == self.deploy.spec.id)
            if sum(1 for m in spec["members"] if m["ready"]) >= self.opt.pool:
                return
            await asyncio.sleep(0.5)
        raise BenchError(f"the pool of {self.opt.pool} did not fill in 900 s")

    async def one(self, http: aiohttp.ClientSession, binary: Path | None, n: int) -> Figures:
        await self.deploy.redis.flushall()
        per_user = -(-self.opt.pool // self.opt.users)
        server = Server(self.deploy, self.tmp, {})
        server.env = {
            "ACS_WARM_POOL": str(self.opt.pool),
            "ACS_MAX_RUNNING_PER_USER": str(per_user),
            "ACS_MAX_SANDBOXES_PER_USER": str(per_user),
            # Nothing refilled while the loops run: the refill's boots are not a claim's work.
            "ACS_POOL_REFILL_DELAY": "60",
            # Links through this control plane's sandbox proxy (the proxied command).
            "ACS_PROXY_URL": server.url,
        }
        server.binary = binary
        label = self.label(binary)
        if self.opt.profile is not None and binary is None:
            self.opt.profile.mkdir(parents=True, exist_ok=True)
            server.profile = self.opt.profile / f"round{n}.prof"
        print(f"round {n}: {label}", file=sys.stderr)
        await server.start(http)
        try:
            keys = [await self.deploy.user_key(f"cpu-{u}") for u in range(self.opt.users)]
            await self.pool_full(http, server.url)
            await asyncio.sleep(2.0)  # the last boots' work settles
            spy = await self.spy(server, "idle")
            cpu0, t0 = server.cpu(), time.perf_counter()
            await asyncio.sleep(self.opt.idle)
            idle = (server.cpu() - cpu0) / (time.perf_counter() - t0)
            await py_spy_stop(spy)
            row = await self.loops(http, server, keys, idle, label)
        finally:
            await server.stop()
            await asyncio.to_thread(self.deploy.remove_everything)
        print(f"  {row}", file=sys.stderr)
        return row

    async def loops(
        self, http: aiohttp.ClientSession, server: Server, keys: list[str], idle: float, label: str
    ) -> Figures:
        """The three loops, one request at a time; each kind's CPU (its loop's, less the idle
        rate over its duration) and wall time per request, in ms."""
        claimed: list[tuple[str, dict[str, Any]]] = []

        async def claim(i: int) -> None:
            key = keys[i % len(keys)]
            async with http.post(
                f"{server.url}/api/v1/sandboxes", headers={"X-Session-API-Key": key}, json={}
            ) as resp:
                body = await resp.json()
                if resp.status != 200 or body["status"] != "RUNNING":
                    raise BenchError(f"claim {i}: {resp.status} {body}")
            claimed.append((key, body))

        by_user: dict[str, str] = {}

        async def poll(i: int) -> None:
            key = keys[i % len(keys)]
            async with http.get(
                f"{server.url}/api/v1/sandboxes?{by_user[key]}",
                headers={"X-Session-API-Key": key},
            ) as resp:
                if resp.status != 200:
                    raise BenchError(f"poll {i}: {resp.status} {await resp.text()}")
                await resp.read()

        async def proxied(i: int) -> None:
            body = claimed[i % len(claimed)][1]
            url = body["exposed_urls"][0]["url"]
            if not url.startswith(server.url):
                raise BenchError(f"the exposed link is not the proxy's: {url}")
            output = await BurstBench.first_command(http, url, body["session_api_key"])
            if EXPECTED not in output:
                raise BenchError(f"proxied command answered {output[:80]!r}")

        redis_pid = int((await self.deploy.redis.info("server"))["process_id"])
        redis_cpu: dict[str, float] = {}

        async def timed(count: int, call: Callable[[int], Awaitable[None]]) -> tuple[float, float]:
            spy = await self.spy(server, call.__name__)
            cpu0, t0, r0 = server.cpu(), time.perf_counter(), process_cpu(redis_pid)
            for i in range(count):
                await call(i)
            wall = time.perf_counter() - t0
            redis_cpu[call.__name__] = (process_cpu(redis_pid) - r0) / count * 1000
            await py_spy_stop(spy)
            return (server.cpu() - cpu0 - idle * wall) / count * 1000, wall / count * 1000

        claim_cpu, claim_wall = await timed(self.opt.pool, claim)
        # A user's poll: the batch GET of all their sandboxes (RUNNING: their keys shown).
        for key, body in claimed:
            by_user[key] = "&".join(filter(None, (by_user.get(key), f"id={body['id']}")))
        poll_cpu, poll_wall = await timed(self.opt.polls, poll)
        proxied_cpu, proxied_wall = await timed(self.opt.commands, proxied)
        direct = await self.direct(http, claimed)
        return Figures(
            label,
            claim_cpu,
            poll_cpu,
            proxied_cpu,
            idle * 1000,
            claim_wall,
            poll_wall,
            proxied_wall,
            direct,
            redis_cpu["claim"],
            redis_cpu["poll"],
        )

    async def spy(self, server: Server, kind: str) -> asyncio.subprocess.Process | None:
        """py-spy sampling the server over one loop (--py-spy DIR: DIR/<kind>-<n>.txt); its CPU
        is its own process's."""
        if self.opt.py_spy is None or server.process is None:
            return None
        out = self.opt.py_spy / f"{kind}-{len(self.rows)}.txt"
        return await py_spy(server.process.pid, out, 1000)

    async def direct(
        self, http: aiohttp.ClientSession, claimed: list[tuple[str, dict[str, Any]]]
    ) -> float:
        """The same first command straight to the agent servers' published ports (the raw
        path, no control plane; each record's port, read from Redis): its wall time per
        command, in ms."""
        targets = []
        for _, body in claimed:
            ports = await self.deploy.redis.hget(keyspace.sandbox(body["id"]), "ports")
            port = next(iter(json.loads(ports or "{}").values()), None)
            if port is not None:
                targets.append((f"http://127.0.0.1:{port}", body["session_api_key"]))
        if not targets:
            raise BenchError("no published port in the claimed sandboxes' records")
        t0 = time.perf_counter()
        for i in range(self.opt.commands):
            url, key = targets[i % len(targets)]
            output = await BurstBench.first_command(http, url, key)
            if EXPECTED not in output:
                raise BenchError(f"direct command answered {output[:80]!r}")
        return (time.perf_counter() - t0) / self.opt.commands * 1000

    def table(self) -> list[str]:
        lines = [
            f"CPU of the control plane per request, ms (sequential; pool {self.opt.pool}, "
            f"{self.opt.users} users, {self.opt.polls} polls, {self.opt.commands} commands)",
            "| control plane | claim CPU | poll CPU | proxied command CPU | idle CPU ms/s "
            "| claim wall | poll wall | proxied wall | direct wall (raw) "
            "| Redis CPU claim / poll |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in self.rows:
            lines.append(
                f"| {r.label} | {r.claim:.2f} | {r.poll:.2f} | {r.proxied:.2f} | "
                f"{r.idle_per_s:.2f} | {r.claim_wall:.2f} | {r.poll_wall:.2f} | "
                f"{r.proxied_wall:.2f} | {r.direct_wall:.2f} | "
                f"{r.redis_claim:.2f} / {r.redis_poll:.2f} |"
            )
        labels = list(dict.fromkeys(r.label for r in self.rows))
        for name in ("claim", "poll", "proxied"):
            medians = [
                percentile([getattr(r, name) for r in self.rows if r.label == lab], 50)
                for lab in labels
            ]
            lines.append(f"median {name} CPU: " + ", ".join(f"{m:.2f}" for m in medians) + " ms")
        return lines


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.request_cpu", description=__doc__)
    parser.add_argument("--pool", type=int, default=20, help="members claimed per round (20)")
    parser.add_argument("--users", type=int, default=2, help="users they belong to (2)")
    parser.add_argument("--polls", type=int, default=500, help="batch GETs per round (500)")
    parser.add_argument("--commands", type=int, default=200, help="proxied commands (200)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the planes (2)")
    parser.add_argument("--idle", type=float, default=5.0, help="idle CPU measured over (5 s)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument(
        "--control-plane",
        dest="control_planes",
        type=Path,
        action="append",
        default=[],
        help="a `controlplane` executable to measure (repeatable; default this venv's)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="this venv's control plane under cProfile, DIR/round<n>.prof (not for figures)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="sample the server with py-spy (this venv's) over each loop, DIR/<kind>-<n>.txt",
    )
    args = parser.parse_args(argv)
    if args.pool < 1 or args.users < 1 or args.polls < 1 or args.commands < 1:
        parser.error("counts must be positive")
    return Options(
        args.pool,
        args.users,
        args.polls,
        args.commands,
        args.rounds,
        args.idle,
        args.json_path,
        args.control_planes,
        args.profile,
        args.py_spy,
    )


main = main_of(parse, RequestCpuBench, "acs-request-cpu-")

if __name__ == "__main__":
    sys.exit(main(None))
