"""`controlplane serve` with ACS_WORKERS=2, as real processes on a real Redis: both workers
serve the one port, any worker's /metrics counts every worker's
requests, a worker killed is started again while the other serves, SIGTERM stops them all and
exits 0, and workers die with a killed supervisor; the host's boots at once are split among
them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from controlplane.config import load_config
from controlplane.sandboxes.start_gate import QUEUE_PER_SLOT, STARTS_PER_CPU, bounds
from controlplane.workers import METRICS_PREFIX, SWEEP_AFTER
from tests.conftest import BOOTSTRAP_KEY
from tests.support.live_server import free_port
from tests.support.serve_process import Serve, launch_serve, serve_env

HEADERS = {"X-Session-API-Key": BOOTSTRAP_KEY}
SEARCH = "/api/v1/sandboxes/search"


Starter = Callable[..., Awaitable[Serve]]


@pytest.fixture
async def start_workers(redis_url: str, test_prefix: str, tmp_path: Path) -> AsyncIterator[Starter]:
    """Starts `serve` with ACS_WORKERS=2 (on the test's Redis, unless `redis_url=None`: the
    embedded one) on a port of its own, the test's data directory; kills what is left."""
    started: list[Serve] = []

    async def start(
        *, redis: str | None = redis_url, port: int | None = None, **settings: str
    ) -> Serve:
        env = serve_env(redis or "", test_prefix, tmp_path / "data")
        if redis is None:
            del env["ACS_REDIS_URL"]
        env.update({"ACS_WORKERS": "2", "ACS_WARM_POOL": "0", "ACS_LOG_LEVEL": "info"})
        env.update(settings)
        server = await launch_serve(port or free_port(), env)
        started.append(server)
        return server

    yield start
    for server in started:
        pids = worker_pids(server)
        if server.process.returncode is None:
            with contextlib.suppress(AssertionError):
                await server.terminate()
        await server.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def workers(start_workers: Starter) -> Serve:
    return await start_workers()


def worker_pids(server: Serve) -> list[int]:
    """The pids the supervisor started (and restarted), from its log."""
    pids: list[int] = []
    for event in server.events():
        if event.get("event") == "workers_started":
            pids.extend(event["pids"])
        elif event.get("event") == "worker_restarted":
            pids.append(event["pid"])
    return pids


def metrics_dir(server: Serve) -> Path:
    started = [e for e in server.events() if e.get("event") == "workers_started"]
    assert started, server.logs()
    return Path(started[0]["metrics_dir"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is gone for our purposes.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


async def gone(pid: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive after {within} s"
        await asyncio.sleep(0.05)


async def both_serving(server: Serve, http: aiohttp.ClientSession) -> None:
    await server.wait_healthy(http)
    deadline = time.monotonic() + 60
    while {e.get("worker") for e in server.events() if e.get("event") == "serving"} != {0, 1}:
        assert time.monotonic() < deadline, f"not both workers serving:\n{server.logs()}"
        await asyncio.sleep(0.05)


async def searches(server: Serve, count: int) -> None:
    """`count` searches, each on a connection of its own (the kernel picks a worker per
    connection); every one answered 200."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(count):
            async with http.get(f"{server.url}{SEARCH}", headers=HEADERS) as resp:
                assert resp.status == 200, await resp.text()


async def searches_counted(server: Serve, http: aiohttp.ClientSession) -> float:
    async with http.get(f"{server.url}/metrics", headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    found = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels: dict[str, Any] = sample.labels
            if (
                sample.name == "acs_http_requests_total"
                and labels.get("route") == SEARCH
                and labels.get("status") == "200"
            ):
                found += sample.value
    return found


async def test_two_workers_share_the_port_and_each_counts_for_all(workers: Serve) -> None:
    async with aiohttp.ClientSession() as http:
        await both_serving(workers, http)
        assert {e.get("event_loop") for e in workers.events() if e.get("event") == "serving"} == {
            "asyncio"
        }
        await searches(workers, 40)
        answered_by = {
            e.get("worker")
            for e in workers.events()
            if e.get("event") == "request" and e.get("path") == SEARCH
        }
        assert answered_by == {0, 1}, answered_by
        # Whichever worker answers the scrape, it counts the other's requests too.
        for _ in range(4):
            assert await searches_counted(workers, http) == 40


async def test_a_killed_worker_is_started_again_and_sigterm_stops_every_worker(
    start_workers: Starter,
) -> None:
    """On uvloop (ACS_EVENT_LOOP), which a server must leave at SIGTERM too."""
    workers = await start_workers(ACS_EVENT_LOOP="uvloop")
    async with aiohttp.ClientSession() as http:
        await both_serving(workers, http)
        assert {e.get("event_loop") for e in workers.events() if e.get("event") == "serving"} == {
            "uvloop"
        }
        await searches(workers, 10)
        first, second = worker_pids(workers)
        os.kill(first, signal.SIGKILL)
        await gone(first)  # its socket closed with it: no connection is sent there after
        await searches(workers, 10)  # the other serves meanwhile
        await workers.wait_event("worker_restarted", within=30)
        restarted = worker_pids(workers)[-1]
        assert restarted not in (first, second)
        assert alive(restarted)
        deadline = time.monotonic() + 60
        while sum(1 for e in workers.events() if e.get("event") == "serving") < 3:
            assert time.monotonic() < deadline, workers.logs()
            await asyncio.sleep(0.05)
        await searches(workers, 10)
        # The killed worker's counts stay in the sum: a counter never goes back.
        assert await searches_counted(workers, http) == 30

    code, _took = await workers.terminate()
    assert code == 0, workers.logs()
    assert not any(alive(pid) for pid in (second, restarted))
    assert any(e.get("event") == "workers_stopped" for e in workers.events())


async def test_workers_end_with_a_killed_supervisor_and_the_next_start_sweeps_its_files(
    workers: Serve, start_workers: Starter, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as http:
        await both_serving(workers, http)
        left = metrics_dir(workers)
        assert left.parent == tmp_path / "data"
        assert any(p.suffix == ".db" for p in left.iterdir())  # the workers' files
        pids = worker_pids(workers)
        workers.process.kill()  # no SIGTERM to hand on: the kernel's PR_SET_PDEATHSIG acts
        await workers.process.wait()
        for pid in pids:
            await gone(pid, within=40)  # each drains as after a SIGTERM
        assert left.is_dir()  # nothing removed it: the supervisor was killed
        # Aged past SWEEP_AFTER, as a killed supervisor's is by the next start; a directory
        # made just now and not locked yet (a supervisor starting beside) is left alone.
        aged = time.time() - 2 * SWEEP_AFTER
        os.utime(left, (aged, aged))
        starting = tmp_path / "data" / f"{METRICS_PREFIX}starting"
        starting.mkdir()

        again = await start_workers()
        await both_serving(again, http)
        assert not left.exists()
        assert starting.is_dir()
        assert metrics_dir(again).is_dir()


async def test_workers_share_one_embedded_redis(start_workers: Starter, tmp_path: Path) -> None:
    """Without ACS_REDIS_URL the supervisor starts the embedded Redis before its workers, so
    they find it running instead of each starting one on the same files."""
    sock = tmp_path / "data" / "redis" / "redis.sock"
    try:
        server = await start_workers(redis=None)
        async with aiohttp.ClientSession() as http:
            await both_serving(server, http)
            await searches(server, 6)
        assert len(_redis_servers(sock)) == 1, _redis_servers(sock)
    finally:
        if sock.exists():
            client = aioredis.Redis(unix_socket_path=str(sock), retry=Retry(NoBackoff(), 0))
            with contextlib.suppress(redis.ConnectionError):
                await client.shutdown()
            await client.aclose()


def _redis_servers(sock: Path) -> list[str]:
    """The command lines of the redis-servers listening on `sock` (their title names it)."""
    lines = [_cmdline(p) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [line for line in lines if "redis-server" in line and str(sock) in line]


def _cmdline(proc: Path) -> str:
    with contextlib.suppress(OSError):
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def test_a_hosts_boots_at_once_are_split_among_its_workers() -> None:
    """Each worker is a replica with its own start gate: unset, the host's share (2 per CPU)
    is divided among them, at least 1 each; set, ACS_MAX_CONCURRENT_STARTS is each one's."""
    per_host = STARTS_PER_CPU * (os.cpu_count() or 1)
    assert bounds(load_config({}), boots_here=True) == (per_host, QUEUE_PER_SLOT * per_host)
    halves = max(1, per_host // 2)
    assert bounds(load_config({"ACS_WORKERS": "2"}), boots_here=True) == (
        halves,
        QUEUE_PER_SLOT * halves,
    )
    assert bounds(load_config({"ACS_WORKERS": "64"}), boots_here=True)[0] == max(1, per_host // 64)
    assert bounds(
        load_config({"ACS_WORKERS": "2", "ACS_MAX_CONCURRENT_STARTS": "3"}), boots_here=True
    ) == (3, QUEUE_PER_SLOT * 3)


async def test_a_port_in_use_fails_the_start(start_workers: Starter) -> None:
    """Something (here a listening socket of this very user, which SO_REUSEPORT would let the
    workers join) holds the API's port: the supervisor exits 2 at once, naming it."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = await start_workers(port=port)
        code = await asyncio.wait_for(server.process.wait(), 30)
        await server.exited(time.monotonic())
        assert code == 2, server.logs()
        assert f"127.0.0.1:{port} is in use" in server.logs()
