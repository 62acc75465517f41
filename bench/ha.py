"""High availability, measured against the raw operation in the same run.

Run with `make bench`, or `.venv/bin/python -m bench.ha [--only failover|wait|proxy|rolling]`.
bench/README.md says what is measured. Targets:

- failover: requests during a Redis Sentinel failover (master killed with SIGKILL) see at most
  ~3 s of added latency (the slowest request around the kill minus the p50 before it) and 0
  errors; raw: how long Sentinel itself took to name a new master;
- wait: what WAIT (no request acknowledged before a replica has its writes) costs a request that
  writes, against the same request without it, and a raw SET against SET + WAIT;
- proxy: a small request through the sandbox proxy adds at most 1 ms at p50 over the same
  request straight to the sandbox's port, and a large download keeps at least 90 % of the
  direct throughput;
- rolling: a rolling restart of 3 `controlplane serve` replicas behind haproxy under load fails
  0 requests and loses 0 starts.

Exit status: 0 when the table was printed (a missed target is marked in it), 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import docker
import redis.asyncio as aioredis
from aiohttp import web
from cryptography.fernet import Fernet

from bench.common import REPO, percentile
from controlplane.app import create_app
from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig, load_config
from controlplane.logging import configure_logging
from tests.support.docker_fixtures import remove_matching
from tests.support.ha_load import Load, Traffic, ready_conversation, settled
from tests.support.live_server import Api, free_port
from tests.support.proxy_app import PROXIED_SPEC, serve_app
from tests.support.redis_server import RedisServer
from tests.support.replica_set import ReplicaSet
from tests.support.sandbox_helpers import spec_dir
from tests.support.sentinel_cluster import MASTER_NAME, SentinelCluster
from tests.support.serve_process import launch_serve, serve_env

MIB = 1024 * 1024
KEY = "bench-bootstrap-key-" + secrets.token_hex(8)
SECRET = Fernet.generate_key().decode()  # one for every app of the run: they share Redis


@dataclass
class Row:
    name: str
    measured: str
    raw: str
    ratio: str
    target: str
    ok: bool


@contextlib.asynccontextmanager
async def served(config: ServiceConfig, *, sandboxes: bool, port: int = 0) -> AsyncIterator[str]:
    """The app on loopback, as `serve` runs it (less the signals)."""
    runner = web.AppRunner(create_app(config, with_sandboxes=sandboxes), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = next(int(a[1]) for a in runner.addresses if isinstance(a, tuple))
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        await runner.cleanup()


def _config(tmp: Path, **values: Any) -> ServiceConfig:
    defaults: dict[str, Any] = {
        "data_dir": tmp / "data",
        "bootstrap_api_key": KEY,
        "spec_dir": REPO / "specs",
        "secret_key": SECRET,
        "log_level": "warning",
        "log_format": "json",
        "rate_limit_per_minute": 0,
        "warm_pool": "0",
    }
    return load_config({}, **(defaults | values))


# -- Redis: a failover, and what WAIT costs -----------------------------------------------------


async def _timed(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> float | None:
    """Seconds the request took; None when it failed (an error status or none)."""
    started = time.monotonic()
    try:
        async with http.request(method, url, headers={"X-Session-API-Key": KEY}, **kw) as resp:
            await resp.read()
            ok = resp.status < 300
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    return time.monotonic() - started if ok else None


async def bench_failover(tmp: Path, quick: bool) -> list[Row]:
    cluster = SentinelCluster(tmp / "failover")
    cluster.start()
    try:
        config = _config(
            tmp, redis_sentinels=cluster.sentinel_addresses, redis_sentinel_master=MASTER_NAME
        )
        async with served(config, sandboxes=False) as url, aiohttp.ClientSession() as http:
            samples: list[tuple[float, float | None]] = []  # (sent, seconds or None)
            stop = asyncio.Event()

            async def client(n: int) -> None:
                while not stop.is_set():
                    sent = time.monotonic()
                    if n % 2:
                        took = await _timed(http, "GET", f"{url}/api/settings")
                    else:
                        body = {"language": secrets.choice(["en", "fr", "de"])}
                        took = await _timed(http, "POST", f"{url}/api/settings", json=body)
                    samples.append((sent, took))
                    await asyncio.sleep(0.01)

            clients = [asyncio.create_task(client(n)) for n in range(4)]
            await asyncio.sleep(2 if quick else 4)
            killed = time.monotonic()
            old = cluster.kill_master()
            failover = await asyncio.to_thread(cluster.wait_failover, old.port)
            await asyncio.sleep(3)
            stop.set()
            await asyncio.gather(*clients)
    finally:
        cluster.stop()
    before = [t for s, t in samples if t is not None and s < killed]
    around = [t for s, t in samples if t is not None and killed - 1 <= s <= killed + failover + 1]
    errors = sum(1 for _s, t in samples if t is None)
    base = statistics.median(before)
    added = max(around) - base
    return [
        Row(
            "failover: slowest request minus p50 before",
            f"{added:.2f} s ({len(samples)} requests, {errors} failed)",
            f"Sentinel named a new master after {failover:.2f} s",
            f"{added / failover:.2f}",
            "<= ~3 s, 0 failed",
            added <= 3.5 and errors == 0,
        )
    ]


async def bench_wait(tmp: Path, quick: bool) -> list[Row]:
    """POST /api/settings p50 with WAIT 1 against the same app without it (alternating), on one
    Sentinel set-up; and a raw SET against SET + WAIT 1."""
    cluster = SentinelCluster(tmp / "wait")
    cluster.start()
    runs = 200 if quick else 600
    try:
        common = {"redis_sentinels": cluster.sentinel_addresses}
        common["redis_sentinel_master"] = MASTER_NAME
        waiting = _config(tmp / "a", **common)
        not_waiting = _config(tmp / "b", redis_wait_replicas=0, **common)
        times: dict[str, list[float]] = {"wait": [], "none": [], "raw_set": [], "raw_wait": []}
        async with (
            served(waiting, sandboxes=False) as a,
            served(not_waiting, sandboxes=False) as b,
            aiohttp.ClientSession() as http,
        ):
            for n in range(runs):
                for name, url in (
                    (("wait", a), ("none", b)) if n % 2 else (("none", b), ("wait", a))
                ):
                    took = await _timed(
                        http, "POST", f"{url}/api/settings", json={"language": "en"}
                    )
                    assert took is not None, f"POST /api/settings failed on {name}"
                    times[name].append(took)
        raw = aioredis.Redis(port=cluster.master_port())
        for n in range(runs):
            started = time.monotonic()
            await raw.set("bench", n)
            times["raw_set"].append(time.monotonic() - started)
            started = time.monotonic()
            async with raw.pipeline(transaction=False) as pipe:
                pipe.set("bench", n)
                pipe.execute_command("WAIT", 1, 1000)
                await pipe.execute()
            times["raw_wait"].append(time.monotonic() - started)
        await raw.aclose()
    finally:
        cluster.stop()
    ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return [
        Row(
            "wait: POST /api/settings p50, WAIT 1 vs none",
            f"{ms['wait']:.2f} ms vs {ms['none']:.2f} ms (+{ms['wait'] - ms['none']:.2f} ms)",
            f"SET {ms['raw_set']:.3f} ms, SET+WAIT {ms['raw_wait']:.3f} ms",
            f"{ms['wait'] / ms['none']:.2f}",
            "measured (no target)",
            True,
        )
    ]


# -- the sandbox proxy --------------------------------------------------------------------------


async def bench_proxy(tmp: Path, quick: bool, prefix: str) -> list[Row]:
    """The control plane as deployed (`controlplane serve`, a process of its own) in front of a
    sandbox serving tests/proxy_app.py's app; this process is the client of both paths."""
    redis_server = RedisServer(tmp / "proxy-redis")
    redis_server.start()
    port = free_port()
    env = serve_env(redis_server.url, prefix, tmp / "proxy-data")
    env.update(
        {
            "ACS_BOOTSTRAP_API_KEY": KEY,
            "ACS_SECRET_KEY": SECRET,
            "ACS_SPEC_DIR": str(spec_dir(tmp, {"proxied": PROXIED_SPEC})),
            "ACS_PROXY_URL": f"http://127.0.0.1:{port}",
            "ACS_LOG_LEVEL": "warning",
            "ACS_WARM_POOL": "0",
        }
    )
    server = await launch_serve(port, env)
    client = docker.from_env()
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_healthy(http, within=60)
            return await _proxy_runs(http, client, server.url, prefix, quick)
    finally:
        await server.kill()
        redis_server.stop()
        client.close()


async def _sandbox_app(
    http: aiohttp.ClientSession, client: docker.DockerClient, url: str, prefix: str
) -> tuple[str, str, dict[str, str]]:
    """A RUNNING sandbox of the proxied spec with its app up: (proxied URL, direct URL, the
    sandbox key's header)."""
    api = Api(http, url, KEY)
    created = await api.ok("POST", "/api/v1/sandboxes", json={"sandbox_spec_id": "proxied"})
    sandbox: dict[str, Any] = {}
    for _ in range(600):
        sandbox = await api.ok("GET", f"/api/v1/sandboxes/{created['id']}")
        if sandbox["status"] == "RUNNING":
            break
        await asyncio.sleep(0.1)
    await serve_app(client, prefix, sandbox["id"])
    worker = next(u for u in sandbox["exposed_urls"] if u["name"] == "WORKER_1")
    direct = f"http://127.0.0.1:{worker['port']}/"
    for _ in range(300):  # the app starting
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(direct + "ping") as resp:
                if resp.status == 200:
                    break
        await asyncio.sleep(0.1)
    return str(worker["url"]), direct, {"X-Session-API-Key": sandbox["session_api_key"]}


async def _proxy_runs(
    http: aiohttp.ClientSession, client: docker.DockerClient, url: str, prefix: str, quick: bool
) -> list[Row]:
    proxied, direct, headers = await _sandbox_app(http, client, url, prefix)

    async def get(base: str) -> float:
        started = time.perf_counter()
        async with http.get(base + "ping", headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        return time.perf_counter() - started

    async def download(base: str, mib: int) -> float:
        started = time.perf_counter()
        total = 0
        async with http.get(f"{base}big?mb={mib}", headers=headers) as resp:
            async for chunk in resp.content.iter_chunked(MIB):
                total += len(chunk)
        assert total == mib * MIB, total
        return mib / (time.perf_counter() - started)

    for _ in range(100 if quick else 400):  # warm-up
        await get(direct)
        await get(proxied)
    small: dict[str, list[float]] = {"direct": [], "proxy": []}
    rates: dict[str, list[float]] = {"direct": [], "proxy": []}
    mib = 128 if quick else 512
    for n in range(300 if quick else 1500):  # alternating, either first by turns
        for name, base in (("direct", direct), ("proxy", proxied))[:: 1 if n % 2 else -1]:
            small[name].append(await get(base))
    for n in range(3 if quick else 5):
        for name, base in (("direct", direct), ("proxy", proxied))[:: 1 if n % 2 else -1]:
            rates[name].append(await download(base, mib))
    d50, p50 = statistics.median(small["direct"]) * 1000, statistics.median(small["proxy"]) * 1000
    rd, rp = statistics.median(rates["direct"]), statistics.median(rates["proxy"])
    return [
        Row(
            "proxy: small GET p50 added",
            f"{p50:.2f} ms (+{p50 - d50:.2f} ms)",
            f"{d50:.2f} ms direct",
            f"{p50 / d50:.2f}",
            "<= +1 ms",
            p50 - d50 <= 1.0,
        ),
        Row(
            f"proxy: {mib} MiB download",
            f"{rp:.0f} MiB/s",
            f"{rd:.0f} MiB/s direct",
            f"{rp / rd:.2f}",
            ">= 0.90",
            rp / rd >= 0.9,
        ),
    ]


# -- a rolling restart ---------------------------------------------------------------------------


async def bench_rolling(tmp: Path, prefix: str) -> list[Row]:
    redis_server = RedisServer(tmp / "rolling-redis")
    redis_server.start()
    deployment = ReplicaSet(redis_server.url, prefix, tmp / "rolling")
    try:
        async with aiohttp.ClientSession() as http:
            await deployment.start(http)
            setup = aioredis.Redis.from_url(redis_server.url)
            key = (await ApiKeyService(setup, None).create("bench")).key
            await setup.aclose()
            api = Api(http, deployment.url, key)
            body = {"llm_model": "fake-model", "llm_base_url": "http://127.0.0.1:9/v1"}
            await api.ok("POST", "/api/settings", json=body)
            sandbox, conversation = await ready_conversation(api)
            load = Load()
            traffic = Traffic(api, load, sandbox, conversation)
            await asyncio.sleep(3)
            rolled = time.monotonic()
            for n in range(deployment.size):
                await deployment.roll(n, http)
            took = time.monotonic() - rolled
            await asyncio.sleep(2)
            await traffic.stop()
            failed = load.failures()
            lost = "0"
            try:
                await settled(api, load, within=120)
            except AssertionError as exc:
                lost = f"some ({exc})"
    finally:
        await deployment.stop()
        redis_server.stop()
    before = [o.took for o in load.outcomes if o.sent < rolled and o.took]
    during = [o.took for o in load.outcomes if o.sent >= rolled and o.took]
    starts = len(load.tasks) + len(load.sandboxes)
    return [
        Row(
            "rolling restart of 3 replicas",
            f"{len(failed)} failed of {len(load.outcomes)}, {lost} of {starts} starts lost",
            f"p99 {percentile(before, 99) * 1000:.0f} ms before, "
            f"{percentile(during, 99) * 1000:.0f} ms during ({took:.0f} s)",
            "",
            "0 failed, 0 lost",
            not failed and lost == "0",
        )
    ]


def remove_everything(prefix: str) -> None:
    """Every container, volume and sandbox network the run made (with its firewall rules)."""
    client = docker.from_env()
    try:
        remove_matching(client, prefix)
    finally:
        client.close()


async def run(args: argparse.Namespace, tmp: Path) -> list[Row]:
    prefix = f"acs-bench-{secrets.token_hex(3)}-"
    parts: dict[str, Callable[[], Awaitable[list[Row]]]] = {
        "failover": lambda: bench_failover(tmp, args.quick),
        "wait": lambda: bench_wait(tmp, args.quick),
        "proxy": lambda: bench_proxy(tmp, args.quick, prefix + "p-"),
        "rolling": lambda: bench_rolling(tmp, prefix + "r-"),
    }
    rows: list[Row] = []
    try:
        for name, part in parts.items():
            if args.only in (None, name):
                print(f"{name}…", file=sys.stderr, flush=True)
                rows += await part()
    finally:
        await asyncio.to_thread(remove_everything, prefix)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", choices=["failover", "wait", "proxy", "rolling"])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args(argv)
    configure_logging("console", "warning", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="acs-bench-ha-") as tmp:
        try:
            rows = asyncio.run(run(args, Path(tmp)))
        except Exception as exc:
            print(f"bench: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("name", "measured", "raw")]
    print()
    for r in rows:
        print(
            f"{r.name:<{widths[0]}}  {r.measured:<{widths[1]}}  raw: {r.raw:<{widths[2]}}  "
            f"ratio {r.ratio or '-':>5}  target {r.target}  {'ok' if r.ok else 'MISSED'}"
        )
    missed = [r.name for r in rows if not r.ok]
    print("\n" + ("all targets met" if not missed else "MISSED: " + "; ".join(missed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
