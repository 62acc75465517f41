"""The CPU of one LLM gateway call in our server, against its floor (issue 30, item 3: "find our
own floor"): the same calls through a bare relay (one HTTP hop through Python, in a process of
its own, checking nothing) and through `controlplane serve` (the user's gateway key, prices and
the per-user rate limit on, as in gateway_peer.py), each answered by the scripted model.

    .venv/bin/python -m bench.gateway_cpu                       # 2,000 calls at 1 and 16
    .venv/bin/python -m bench.gateway_cpu --control-plane /work/main/.venv/bin/controlplane \\
        --control-plane .venv/bin/controlplane                  # before / after, in turn
    .venv/bin/python -m bench.gateway_cpu --py-spy DIR          # ours sampled, DIR/<n>.txt

Each server's CPU (user + system, /proc) over its calls, per call; what one core sustains at
that cost (1 / CPU per call); the calls a second it reached here (the client, the model and
Redis share the host's cores with it). The targets, rounds and order are as in
gateway_peer.py: each level in rounds, the targets in turn, the order reversed every round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.burst import Server, stop_server
from bench.common import (
    BenchError,
    Deployment,
    concurrency_levels,
    main_of,
    process_cpu,
    py_spy,
    py_spy_stop,
)
from bench.gateway_peer import LLM_KEY, MODEL, USER, Child, Refused, one_call
from tests.support.live_server import free_port


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Options:
    calls: int
    concurrency: list[int]
    rounds: int
    control_planes: list[Path]
    py_spy: Path | None
    json_path: Path | None


@dataclass
class Target:
    name: str
    url: str
    key: str
    pid: int
    cpu: dict[str, float] = field(default_factory=dict)  # "<mode>.c<n>" -> CPU seconds
    calls: dict[str, int] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)


class CpuBench:
    def __init__(self, opt: Options, tmp: Path, redis_url: str) -> None:
        self.opt = opt
        self.tmp = tmp
        self.deploy = Deployment(tmp, redis_url, "acs-bench-gwcpu-")
        self.notes: list[str] = []
        self.children: list[Child] = []
        self.servers: list[Server] = []
        self.targets: list[Target] = []
        self.env_line = ""

    def remove_everything(self) -> int:
        for child in self.children:
            child.stop()
        for server in self.servers:
            stop_server(server)
        return 0

    def close(self) -> None:
        self.deploy.close()

    def results(self) -> Any:
        return {t.name: {"cpu": t.cpu, "calls": t.calls, "wall": t.wall} for t in self.targets}

    async def start(self, http: aiohttp.ClientSession) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACS_")}
        fake_port = free_port()
        fake = Child(
            "the scripted model",
            [sys.executable, "-m", "bench.gateway_peer", "--fake-llm", str(fake_port), LLM_KEY],
            env,
            self.tmp / "fake.log",
        )
        self.children.append(fake)
        base = f"http://127.0.0.1:{fake_port}/v1"
        await fake.start(http, f"{base}/models", {"Authorization": f"Bearer {LLM_KEY}"})

        relay_port = free_port()
        relay = Child(
            "the bare relay",
            [sys.executable, "-m", "bench.gateway_cpu", "--bare-relay", str(relay_port), base],
            env,
            self.tmp / "relay.log",
        )
        self.children.append(relay)
        relay_url = f"http://127.0.0.1:{relay_port}"
        await relay.start(http, f"{relay_url}/ready", {})
        assert relay.process is not None
        self.targets.append(
            Target("bare relay", f"{relay_url}/v1/chat/completions", LLM_KEY, relay.process.pid)
        )

        planes = self.opt.control_planes or [Path(sys.executable).parent / "controlplane"]
        for n, binary in enumerate(planes):
            server = Server(
                self.deploy,
                self.tmp,
                {
                    "ACS_SANDBOX_HOST_PORTS": str(fake_port),
                    "ACS_LLM_PRICES": f'{{"{MODEL}": [0.000001, 0.000002]}}',
                    "ACS_LLM_RATE_LIMIT_PER_MINUTE": "100000000",
                    "ACS_WARM_POOL": "0",
                },
            )
            server.binary = binary
            self.servers.append(server)
            await server.start(http)
            assert server.process is not None
            user = f"{USER}-{n}"
            headers = {"X-Session-API-Key": await self.deploy.user_key(user)}
            settings = {"llm_model": MODEL, "llm_base_url": base, "llm_api_key": LLM_KEY}
            async with http.post(f"{server.url}/api/settings", json=settings, headers=headers) as r:
                if r.status != 200:
                    raise BenchError(f"settings: {r.status} {await r.text()}")
            async with http.get(f"{server.url}/api/keys/llm/byor", headers=headers) as r:
                key = (await r.json())["key"]
            name = "ours" if len(planes) == 1 else f"ours ({binary})"
            url = f"{server.url}/api/v1/llm-gateway/v1/chat/completions"
            self.targets.append(Target(name, url, key, server.process.pid))
        self.env_line = (
            f"env: {os.cpu_count()} cores | Python {sys.version.split()[0]} | "
            f"load avg {os.getloadavg()[0]:.2f}"
        )

    async def level(
        self, http: aiohttp.ClientSession, target: Target, stream: bool, conc: int, calls: int
    ) -> None:
        name = f"{'stream' if stream else 'plain'}.c{conc}"
        left = calls

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                try:
                    await one_call(http, target.url, target.key, stream)
                except Refused as refused:
                    raise BenchError(f"{target.name}: {refused}") from None

        cpu0 = process_cpu(target.pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        target.wall[name] = target.wall.get(name, 0.0) + time.perf_counter() - t0
        target.cpu[name] = target.cpu.get(name, 0.0) + process_cpu(target.pid) - cpu0
        target.calls[name] = target.calls.get(name, 0) + calls

    async def spy(self, target: Target) -> asyncio.subprocess.Process | None:
        """py-spy on one of ours over the measured rounds (--py-spy DIR: DIR/<n>.txt)."""
        if self.opt.py_spy is None:
            return None
        return await py_spy(target.pid, self.opt.py_spy / f"{self.targets.index(target)}.txt", 500)

    async def measure(self) -> tuple[list[str], list[str]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            try:
                await self.start(http)
                log(self.env_line)
                for target in self.targets:  # warm-up: connections, caches, scripts loaded
                    for stream in (False, True):
                        await self.level(http, target, stream, 4, 100)
                    target.cpu.clear()
                    target.calls.clear()
                    target.wall.clear()
                spies = [await self.spy(t) for t in self.targets if t.name.startswith("ours")]
                per_round = max(1, self.opt.calls // self.opt.rounds)
                for conc in self.opt.concurrency:
                    log(f"concurrency {conc}: {self.opt.rounds} rounds of {per_round} calls")
                    for r in range(self.opt.rounds):
                        order = self.targets if r % 2 == 0 else list(reversed(self.targets))
                        for stream in (False, True):
                            for target in order:
                                await self.level(http, target, stream, conc, per_round)
                    self.notes.append(
                        f"load avg after concurrency {conc}: {os.getloadavg()[0]:.1f}"
                    )
                for spy in spies:
                    await py_spy_stop(spy)
            finally:
                self.remove_everything()
        return self.table(), []

    def table(self) -> list[str]:
        lines = [
            self.env_line,
            "server CPU ms/call (user + system of its process); one core: the calls a second "
            "one core sustains at that cost; calls/s: reached here, closed loop",
            "conc | mode   | target | CPU ms/call | over the relay | one core, calls/s | calls/s",
        ]
        floor = self.targets[0]
        for conc in self.opt.concurrency:
            for mode in ("plain", "stream"):
                name = f"{mode}.c{conc}"
                base = floor.cpu[name] / floor.calls[name]
                for target in self.targets:
                    per_call = target.cpu[name] / target.calls[name]
                    over = "" if target is floor else f"+{(per_call - base) * 1000:.3f}"
                    lines.append(
                        f"{conc:>4} | {mode:<6} | {target.name} | {per_call * 1000:.3f} | "
                        f"{over} | {1 / per_call:,.0f} | "
                        f"{target.calls[name] / target.wall[name]:,.0f}"
                    )
        return lines


async def serve_bare_relay(port: int, target: str) -> None:
    """The floor, alone in this process (bench/llm_gateway.py's relay), until terminated."""
    from bench.llm_gateway import bare_relay  # noqa: PLC0415 (the relay's process only)

    runner, _url, upstream = await bare_relay(target, port=port)
    try:
        await asyncio.Event().wait()
    finally:
        await upstream.close()
        await runner.cleanup()


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a target, mode, level")
    parser.add_argument("--concurrency", default="1,16", help="levels (1,16)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds the calls are split in")
    parser.add_argument(
        "--control-plane",
        dest="control_planes",
        type=Path,
        action="append",
        default=[],
        help="a `controlplane` executable to measure (repeatable; default: this venv's)",
    )
    parser.add_argument("--py-spy", type=Path, default=None, help="sample ours into DIR/<n>.txt")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    levels = concurrency_levels(parser, args.concurrency, args.calls, args.rounds)
    return Options(
        args.calls, levels, args.rounds, args.control_planes, args.py_spy, args.json_path
    )


main = main_of(parse, CpuBench, "acs-gwcpu-")

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--bare-relay":
        asyncio.run(serve_bare_relay(int(sys.argv[2]), sys.argv[3]))
    else:
        sys.exit(main(None))
