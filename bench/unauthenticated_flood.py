"""Unauthenticated flood: authenticated latency while others send 1 MB requests without a key.

Run with `make bench`, or `.venv/bin/python -m bench.unauthenticated_flood [--quick]`.
bench/README.md says what is measured. Target: the authenticated p50 and p95 during the flood
within 1.5x of the same requests on the idle server.

The control plane runs as `controlplane serve` in its own process (as deployed: JSON logs at
info, rate limit on, a private redis-server). The flood runs in another process: `--connections`
clients, each opening a connection, sending the head of a POST declaring a 1 MB body with no
key, then the body, and reading the answer, over and over. This process measures the
authenticated requests (GET /api/settings with a user's key, one at a time, on a kept-alive
connection) first on the idle server, then during the flood.

Exit status: 0 when the table was printed (a missed target is marked in it), 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import docker
import redis.asyncio as aioredis

from bench.common import REPO, percentile, process_cpu
from controlplane.auth.service import ApiKeyService
from drivers.docker import networks as docker_networks
from drivers.docker.firewall import HostFirewall
from drivers.errors import DriverError
from tests.support.redis_server import RedisServer

TARGET_RATIO = 1.5
# The attacker's CPU is not the server's: on a host with two cores or more, the flood runs on the
# last core and the server (with this process, whose one request at a time costs little) on the
# others, so that what is measured is the server's work, not the two fighting over one core.
_CPUS = sorted(os.sched_getaffinity(0))
SERVER_CPUS = set(_CPUS[:-1]) if len(_CPUS) > 1 else set()
FLOOD_CPUS = {_CPUS[-1]} if len(_CPUS) > 1 else set()
# And on a shared host the server and this process run at a higher priority than the rest of the
# host's work (as the control plane would on a host of its own); the flood stays at 0.
PRIORITY = -10
BODY_BYTES = 1024 * 1024


# -- the flood (child process) --------------------------------------------------------------


def flood_request(body: int, webhook: bool) -> bytes:
    """What every flooding client sends: a POST declaring `body` bytes of junk with no key;
    with `webhook`, an events webhook post (a sandbox's and a conversation's ids of the right
    shape, a session key of a key's shape that is nobody's) whose `body` bytes are valid events,
    which the handler would parse and check before the key if it read them first."""
    if not webhook:
        return (
            "POST /api/v1/app-conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {body}\r\n\r\n"
        ).encode() + b"x" * body
    one = {"timestamp": "2026-01-01T00:00:00.000000", "source": "agent", "kind": "MessageEvent"}
    events: list[dict[str, str]] = []
    while len(json.dumps(events)) < body - 200:
        events.append({"id": secrets.token_hex(8), **one})
    data = json.dumps(events).encode()
    return (
        f"POST /api/v1/webhooks/{secrets.token_hex(11)}/events/{secrets.token_hex(16)} HTTP/1.1"
        f"\r\nHost: 127.0.0.1\r\nX-Session-API-Key: {secrets.token_urlsafe(32)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _flood_one(port: int, request: bytes, stop: Any, counts: dict[str, int]) -> None:
    """One flooding client: connect, send the head and as much of the body as the server takes
    while waiting for its answer, count the answer, again. Raw non-blocking sockets: the client
    should cost itself as little as possible, so that the flood is as strong as one core allows."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        sock = socket.socket()
        sock.setblocking(False)
        sending: asyncio.Future[None] | None = None
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            sending = asyncio.ensure_future(loop.sock_sendall(sock, request))
            answer = await asyncio.wait_for(loop.sock_recv(sock, 4096), 15)
            status = answer.split(b" ", 2)[1].decode() if answer else "reset"
            counts[status] = counts.get(status, 0) + 1
        except (OSError, IndexError, TimeoutError):
            counts["reset"] += 1
        finally:
            if sending is not None:
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending
            sock.close()


def flood_main(port: int, connections: int, request: bytes, stop: Any, results: Any) -> None:
    if FLOOD_CPUS:
        os.sched_setaffinity(0, FLOOD_CPUS)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)  # not the parent's
    counts: dict[str, int] = {"reset": 0}

    async def run() -> None:
        await asyncio.gather(*(_flood_one(port, request, stop, counts) for _ in range(connections)))

    started = time.monotonic()
    asyncio.run(run())
    counts["seconds_x1000"] = int((time.monotonic() - started) * 1000)
    results.put(counts)


# -- the measurement -----------------------------------------------------------------------


async def measure(url: str, key: str, n: int, interval: float, tag: str = "warm") -> list[float]:
    """n requests, one at a time; each carries X-Request-ID `<tag>-<i>`, so that the server's
    own duration can be found in its log."""
    samples: list[float] = []
    async with aiohttp.ClientSession(headers={"X-Session-API-Key": key}) as http:
        for i in range(n):
            started = time.perf_counter()
            headers = {"X-Request-ID": f"{tag}-{i}"}
            async with http.get(f"{url}/api/settings", headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            samples.append(time.perf_counter() - started)
            await asyncio.sleep(interval)
    return samples


def server_durations(log: Path) -> dict[str, list[float]]:
    """The server's own duration (its request log line: first middleware to the handler's
    answer, no HTTP) of the measured requests, by phase ("idle", "flood")."""
    found: dict[str, list[float]] = {"idle": [], "flood": []}
    for line in log.read_text(errors="replace").splitlines():
        if '"event": "request"' not in line or "/api/settings" not in line:
            continue
        entry = json.loads(line)
        phase = str(entry.get("request_id", "")).split("-", 1)[0]
        if phase in found:
            found[phase].append(float(entry["duration_ms"]) / 1000)
    return found


def waited_seconds(pid: int) -> float:
    """Time the process's threads spent runnable but not running (waiting for a CPU) so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    prefix: str


def start_server(
    tmp: Path, redis_url: str, extra_env: dict[str, str], command: str | None = None
) -> Server:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    prefix = f"acs-bench-flood-{secrets.token_hex(4)}-"
    env = os.environ | {
        "ACS_REDIS_URL": redis_url,
        "ACS_DATA_DIR": str(tmp / "data"),
        "ACS_CONTAINER_PREFIX": prefix,
        "ACS_SPEC_DIR": str(REPO / "specs"),
        "ACS_LOG_FORMAT": "json",
        # No sandboxes at all: a warm pool would boot some and leave them behind at the end.
        "ACS_WARM_POOL": "0",
        **extra_env,
    }
    binary = command or Path(sys.executable).parent / "controlplane"
    log = (tmp / "server.log").open("wb")
    process = subprocess.Popen(
        [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    if SERVER_CPUS:
        os.sched_setaffinity(process.pid, SERVER_CPUS)
    with contextlib.suppress(PermissionError):  # not root: the host's other work counts too
        os.setpriority(os.PRIO_PROCESS, process.pid, PRIORITY)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return Server(process, url, prefix)
        if process.poll() is not None:
            raise RuntimeError(f"controlplane serve exited; see {tmp / 'server.log'}")
        time.sleep(0.1)
    raise RuntimeError("controlplane serve did not listen within 30 s")


def stop_server(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        server.process.kill()
    # Its sandbox network (made at start-up; no sandbox joined it) and firewall rules.
    client = docker.from_env()
    firewall = HostFirewall()
    try:
        for network in client.api.networks(filters={"name": server.prefix}):
            with contextlib.suppress(DriverError):
                removed = docker_networks.remove_network(client, network["Name"])
                if removed and firewall.unavailable() is None:
                    firewall.remove(docker_networks.bridge_name(network["Name"]))
    finally:
        client.close()


def report(
    idle: list[float],
    during: list[float],
    counts: dict[str, int],
    args: Any,
    inside: dict[str, list[float]],
) -> bool:
    ms = 1000.0
    seconds = counts.pop("seconds_x1000") / 1000
    server_cpu = counts.pop("server_cpu_ms") / 1000
    waited = counts.pop("server_waited_ms") / 1000
    idle_waited, idle_seconds = counts.pop("idle_waited_ms") / 1000, counts.pop("idle_ms") / 1000
    requests = sum(counts.values())
    ok = True
    print(
        f"\nauthenticated GET /api/settings, {len(idle)} idle and {len(during)} during the "
        f"flood, in {args.rounds} alternating rounds"
    )
    print(f"{'':10}{'idle':>10}{'flood':>10}{'ratio':>8}  ok?")
    for name, q in (("p50", 50), ("p95", 95)):
        a, b = percentile(idle, q) * ms, percentile(during, q) * ms
        good = b <= a * TARGET_RATIO
        ok &= good
        print(f"{name + ' ms':10}{a:10.2f}{b:10.2f}{b / a:8.2f}  {'yes' if good else 'NO'}")
    if inside["idle"] and inside["flood"]:
        print("inside the server (its request log: middlewares and handler, no HTTP):")
        for name, q in (("p50", 50), ("p95", 95)):
            a, b = percentile(inside["idle"], q) * ms, percentile(inside["flood"], q) * ms
            print(f"{name + ' ms':10}{a:10.2f}{b:10.2f}{b / a:8.2f}")
    print(
        f"\nflood: {args.connections} connections, {requests} requests of {args.body_bytes} "
        f"bytes declared in {seconds:.1f} s ({requests / seconds:.0f}/s)"
    )
    print("answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(
        f"server CPU during the flood: {server_cpu:.1f} s in {seconds:.1f} s, "
        f"{server_cpu / requests * 1000:.2f} ms per flood request"
    )
    print(
        f"server runnable but waiting for a CPU (other processes): {idle_waited:.1f} s in "
        f"{idle_seconds:.1f} s idle, {waited:.1f} s in {seconds:.1f} s of flood"
    )
    load = os.getloadavg()[0]
    pinning = (
        f"server on CPUs {sorted(SERVER_CPUS)}, flood on {sorted(FLOOD_CPUS)}"
        if FLOOD_CPUS
        else "one CPU: server and flood share it"
    )
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    print(f"cores {os.cpu_count()}, {pinning}, server nice {nice}, flood nice 0")
    print(f"load average (1 min) {load:.2f} at the end")
    print(
        f"target: p50 and p95 during the flood <= {TARGET_RATIO}x idle: {'met' if ok else 'MISSED'}"
    )
    return ok


async def flood_round(server: Server, key: str, args: Any, totals: dict[str, int]) -> list[float]:
    """Authenticated requests while a flood process runs; adds the flood's counts to totals."""
    port = int(server.url.rsplit(":", 1)[1])
    stop = multiprocessing.Event()
    results: Any = multiprocessing.Queue()
    flood = multiprocessing.Process(
        target=flood_main,
        args=(
            port,
            args.connections,
            flood_request(args.body_bytes, args.webhook),
            stop,
            results,
        ),
    )
    cpu_before = process_cpu(server.process.pid)
    waited_before = waited_seconds(server.process.pid)
    flood.start()
    try:
        await asyncio.sleep(1.0)  # the flood at full speed before measuring
        per_round = args.requests // args.rounds
        return await measure(server.url, key, per_round, args.interval, "flood")
    finally:
        stop.set()
        counts = await asyncio.to_thread(results.get, timeout=60)
        await asyncio.to_thread(flood.join, 30)
        counts["server_cpu_ms"] = int((process_cpu(server.process.pid) - cpu_before) * 1000)
        waited = waited_seconds(server.process.pid) - waited_before
        counts["server_waited_ms"] = int(waited * 1000)
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + value


async def run(args: Any) -> None:
    if SERVER_CPUS:
        os.sched_setaffinity(0, SERVER_CPUS)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
    with tempfile.TemporaryDirectory(prefix="acs-bench-flood-") as name:
        tmp = Path(name)
        redis_server = RedisServer(tmp / "redis")
        redis_server.start()
        try:
            redis = aioredis.Redis.from_url(redis_server.url)
            key = (await ApiKeyService(redis, None).create("bench")).key
            await redis.aclose()
            extra = {}
            if args.unauthenticated_rate is not None:
                extra["ACS_UNAUTHENTICATED_RATE"] = str(args.unauthenticated_rate)
            server = start_server(tmp, redis_server.url, extra, args.server_command)
            try:
                await measure(server.url, key, 20, args.interval)  # warm-up
                # Idle and flood phases alternate, so that the host's own drift hits both.
                idle: list[float] = []
                during: list[float] = []
                totals: dict[str, int] = {}
                for i in range(args.rounds):
                    print(f"round {i + 1}/{args.rounds}: idle ...", file=sys.stderr)
                    per_round = args.requests // args.rounds
                    before = waited_seconds(server.process.pid), time.monotonic()
                    idle += await measure(server.url, key, per_round, args.interval, "idle")
                    totals["idle_waited_ms"] = totals.get("idle_waited_ms", 0) + int(
                        (waited_seconds(server.process.pid) - before[0]) * 1000
                    )
                    totals["idle_ms"] = totals.get("idle_ms", 0) + int(
                        (time.monotonic() - before[1]) * 1000
                    )
                    print(f"round {i + 1}/{args.rounds}: flood ...", file=sys.stderr)
                    during += await flood_round(server, key, args, totals)
                    await asyncio.sleep(1.0)  # paced answers still due: let them go out
                report(idle, during, totals, args, server_durations(tmp / "server.log"))
            finally:
                stop_server(server)
        finally:
            redis_server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="authenticated, per phase")
    parser.add_argument("--connections", type=int, default=32, help="flood connections")
    parser.add_argument("--interval", type=float, default=0.02, help="between requests (s)")
    parser.add_argument(
        "--body-bytes", type=int, default=BODY_BYTES, help="declared per flood request"
    )
    parser.add_argument("--rounds", type=int, default=10, help="idle/flood alternations")
    parser.add_argument(
        "--unauthenticated-rate",
        type=float,
        default=None,
        help="the server's ACS_UNAUTHENTICATED_RATE (default: its own default; 0: no pacing)",
    )
    parser.add_argument(
        "--server-command",
        default=None,
        help="another `controlplane` executable to measure (e.g. an older version's venv)",
    )
    parser.add_argument(
        "--webhook",
        action="store_true",
        help="flood the events webhook: a wrong key of a key's shape, --body-bytes of valid"
        " events (64 KiB: the most the webhook's handler reads before the key's check)",
    )
    parser.add_argument("--quick", action="store_true", help="100 requests per phase")
    args = parser.parse_args()
    if args.quick:
        args.requests = 100
    try:
        asyncio.run(run(args))
    except (RuntimeError, OSError, AssertionError) as exc:
        print(f"unauthenticated_flood: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
