"""What the benchmarks share. Run them as modules from the repository root (`make bench`, or
`.venv/bin/python -m bench.sandboxes`): they import this module and the test helpers they need
(tests.support: a private redis-server, the scripted model) as packages.

- Samples, and the one percentile every table uses (`percentile`, its definition below).
- serve(): the app over real HTTP on loopback, with a middleware timing each request inside it.
- Deployment: one benchmark deployment on the Docker engine (its name prefix, the control plane's
  configuration, a Redis client, clean-up) and the raw Docker baseline: the very container the
  Docker driver would make for the default spec, made with the driver's own engine calls.
- run_main(): the main every benchmark shares: a private redis-server, the exit status (0 when
  the table was printed, missed targets marked in it; 1 on an error; 130 when interrupted), and
  everything the run made removed at the end, also after an error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
import docker
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from cryptography.fernet import Fernet
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from controlplane import keys
from controlplane.app import create_app
from controlplane.auth.service import ApiKeyService
from controlplane.config import SETTING_NAMES, ServiceConfig, load_config
from controlplane.logging import configure_logging
from controlplane.sandboxes import naming
from controlplane.sandboxes.launcher import network_policy, sandbox_request
from controlplane.sandboxes.models import SandboxRecord
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER, SandboxSpec
from drivers.docker.containers import ContainerRequest, container_request, create_container
from drivers.docker.driver import DockerDriver
from drivers.docker.egress import Attachment
from drivers.docker.settings import DockerSettings
from drivers.egress import HOST_GATEWAY
from tests.support.docker_fixtures import remove_matching
from tests.support.live_server import free_port
from tests.support.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
STATUS_TIMEOUT = 120.0
RAW_HEALTH_POLL = 0.005
"""How often the raw baseline polls a new agent server's /health."""


class BenchError(Exception):
    """The benchmark could not measure what it set out to (reported, exit status 1)."""


# -- numbers ---------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (q in 0..100) by linear interpolation between the closest ranks:
    for n sorted values, the position (n - 1) * q / 100 between the values around it (numpy's
    default, statistics.quantiles' "inclusive" method); p50 is the median. NaN for no values.
    Every benchmark's p50, p95 and p99 mean this."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


@dataclass
class Samples:
    """Durations in seconds by name (api.start, raw.pause, search.first, ...); a name ending in
    _mib is a size in MiB."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.values.setdefault(name, []).append(seconds)

    def p(self, name: str, q: float) -> float:
        return percentile(self.values.get(name, []), q)

    def drop(self, prefix: str) -> None:
        for name in [n for n in self.values if n.startswith(prefix)]:
            del self.values[name]

    def count(self, name: str) -> int:
        return len(self.values.get(name, []))


def publish_host(config: ServiceConfig) -> str:
    """Where the Docker runtime of `config` publishes sandbox ports (the raw paths do too)."""
    assert isinstance(config.runtime, DockerSettings)
    return config.runtime.publish_host


def ms(seconds: float) -> str:
    """Milliseconds: two decimals below 100 ms, one above; "-" for no samples."""
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:.2f}" if seconds < 0.1 else f"{seconds * 1000:.1f}"


def concurrency_levels(parser: argparse.ArgumentParser, levels: str, *counts: int) -> list[int]:
    """`--concurrency` (comma-separated integers) as a list, every level and each of `counts`
    (calls, rounds) positive; anything else ends the run with the parser's usage error."""
    try:
        out = [int(c) for c in levels.split(",") if c]
    except ValueError:
        parser.error("--concurrency takes integers, comma-separated")
    if not out or min(out) < 1 or min(counts, default=1) < 1:
        parser.error("--calls, --rounds and the levels must be positive")
    return out


async def py_spy(pid: int, out: Path, rate: int) -> asyncio.subprocess.Process:
    """py-spy (this venv's) sampling process `pid` into `out` until `py_spy_stop`: raw
    collapsed stacks, only those holding the GIL; returned once attached (a second)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "py-spy"),
        *("record", "--pid", str(pid), "--rate", str(rate), "--gil"),
        *("--format", "raw", "--output", str(out)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(1.0)
    return spy


async def py_spy_stop(spy: asyncio.subprocess.Process | None) -> None:
    """Stop a `py_spy` (it writes its file on SIGINT)."""
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        await spy.wait()


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_busy() -> float:
    """CPU seconds this host's cores have been busy so far, all of them together (/proc/stat:
    everything but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest and guest_nice (fields 8, 9) are already counted in user and nice.
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now (/proc/<pid>/task/<tid>/children)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                queue.extend(int(child) for child in children.read_text().split())
    return found


def serve_env(
    *, redis_url: str, bootstrap_key: str, prefix: str, data_dir: Path, **settings: str
) -> dict[str, str]:
    """The environment of a `controlplane serve` a bench starts in its own process: this
    process's without any ACS_ setting of the shell's, the run's Redis, key, prefix and data
    directory, the repository's specs, JSON logs at warning, then `settings` (ACS_ names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACS_")}
    env.update(
        {
            "ACS_REDIS_URL": redis_url,
            "ACS_BOOTSTRAP_API_KEY": bootstrap_key,
            "ACS_CONTAINER_PREFIX": prefix,
            "ACS_SPEC_DIR": str(REPO / "specs"),
            "ACS_DATA_DIR": str(data_dir),
            "ACS_LOG_LEVEL": "warning",
            "ACS_LOG_FORMAT": "json",
            **settings,
        }
    )
    return env


def docker_time(value: str) -> float:
    """A Docker timestamp (nanoseconds, Z) as epoch seconds."""
    head, _, frac = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


# -- the app under test ------------------------------------------------------------------------


@dataclass
class Served:
    app: web.Application
    url: str
    config: ServiceConfig


def server_timing(samples: Samples) -> Middleware:
    """Time every request inside the server (all middlewares and the handler, no HTTP I/O), as
    `server:<METHOD> <route>`."""

    @web.middleware
    async def timing(request: web.Request, handler: Handler) -> web.StreamResponse:
        t = time.perf_counter()
        try:
            return await handler(request)
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else request.path
            samples.add(f"server:{request.method} {route}", time.perf_counter() - t)

    return timing


def served_config(redis_url: str, tmp: Path, **overrides: Any) -> ServiceConfig:
    """What a bench that serves the app in its own process configures: its private Redis, its
    data under `tmp`, JSON logs at warning (the figures are printed, not logged) and no rate
    limit (the bench sends more than a user would); `overrides` on top."""
    settings: dict[str, Any] = {
        "redis_url": redis_url,
        "data_dir": tmp / "data",
        "spec_dir": REPO / "specs",
        "log_format": "json",
        "log_level": "warning",
        "rate_limit_per_minute": 0,
    }
    return load_config({}, **(settings | overrides))


@contextlib.asynccontextmanager
async def serve(
    config: ServiceConfig,
    samples: Samples,
    *,
    with_sandboxes: bool = True,
    without: Iterable[Middleware] = (),
    on_startup: Callable[[web.Application], None] | None = None,
) -> AsyncIterator[Served]:
    """create_app(config) over real HTTP on 127.0.0.1 and a free port, as `controlplane serve`
    serves it (webhooks on the sandbox networks' gateways), with the timing middleware
    outermost; `with_sandboxes=False`: without the sandbox services (no Docker); `without`:
    middlewares left out (what one costs, measured against the app without it); `on_startup`:
    called once the app's own start-up is done, before it serves (a variant of one of its
    parts, set in its place)."""
    app = create_app(config, with_sandboxes=with_sandboxes)
    for middleware in without:
        app.middlewares.remove(middleware)
    if on_startup is not None:
        change = on_startup

        async def started(app: web.Application) -> None:
            change(app)

        app.on_startup.append(started)
    app.middlewares.insert(0, server_timing(samples))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=10)
    await runner.setup()
    try:
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield Served(app, f"http://127.0.0.1:{port}", config)
    finally:
        await runner.cleanup()


# -- a deployment and the raw Docker baseline --------------------------------------------------


class Deployment:
    """One benchmark run's deployment on the local Docker engine: every container, volume and
    network it makes (the API's and the raw ones) carries `prefix`; raw ones `raw_prefix`, so
    that the app's reconciler, which filters on its own prefix label, never adopts them."""

    def __init__(self, tmp: Path, redis_url: str, prefix: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.prefix = prefix
        self.raw_prefix = f"{prefix}raw-"
        self.secret_key = Fernet.generate_key().decode()
        self.bootstrap_key = "bench-bootstrap-" + secrets.token_hex(12)
        # The images this checkout built (scripts/build-images.sh tags them with ACS_IMAGE_TAG).
        self.image_tag = os.environ.get("ACS_IMAGE_TAG") or None
        self.catalog = SpecCatalog.load(REPO / "specs", self.image_tag)
        self.spec: SandboxSpec = self.catalog.default
        self.docker = docker.from_env(timeout=60)
        self.redis = aioredis.Redis.from_url(redis_url)
        self.health_http: aiohttp.ClientSession | None = None
        self.notes: list[str] = []
        # The API's sandbox network and webhook port: raw containers join the same network.
        self.attachment: Attachment | None = None
        self.webhook_port: int | None = None
        self.api_config: ServiceConfig | None = None

    def config(self, **overrides: Any) -> ServiceConfig:
        """The control plane's configuration for this deployment; `overrides` win."""
        values: dict[str, Any] = {
            "redis_url": self.redis_url,
            "data_dir": self.tmp / "data",
            "bootstrap_api_key": self.bootstrap_key,
            "secret_key": self.secret_key,
            "spec_dir": REPO / "specs",
            "container_prefix": self.prefix,
            "log_format": "json",
            "log_level": "warning",
            # The limiter keeps its per-request cost but never refuses the client's polling.
            "rate_limit_per_minute": 1_000_000,
            "image_tag": self.image_tag,
            # Cold starts are what the benches compare with raw Docker; bench/warm_pool.py turns
            # the pool on itself.
            "warm_pool": 0,
        }
        values.update(overrides)  # None: the control plane's own default
        # Settings this version of the control plane does not have are left out.
        known = SETTING_NAMES
        return load_config({}, **{k: v for k, v in values.items() if k in known})

    def preflight(self) -> None:
        try:
            self.docker.ping()
        except DockerException as exc:
            raise BenchError(f"no Docker engine answers: {exc}") from None
        try:
            self.docker.images.get(self.spec.image)
        except ImageNotFound:
            raise BenchError(f"image {self.spec.image} is missing; run `make images`") from None

    async def user_key(self, user: str) -> str:
        return (await ApiKeyService(self.redis, None).create(user)).key

    def environment(self) -> str:
        version = self.docker.version()
        info = self.docker.info()
        redis_version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
        redis_v = next((w[2:] for w in redis_version if w.startswith("v=")), "?")
        return (
            f"env: {os.cpu_count()} cores | {platform.system()} {platform.release()} | "
            f"Python {platform.python_version()} | Docker {version.get('Version')} "
            f"(API {version.get('ApiVersion')}, {info.get('Driver')}, "
            f"cgroup v{info.get('CgroupVersion', '?')}) | redis-server {redis_v} | "
            f"aiohttp {aiohttp.__version__} | image {self.spec.image} | "
            f"load avg {os.getloadavg()[0]:.2f}"
        )

    def foreign_containers(self) -> int:
        """Running containers of others on the engine (they load it too)."""
        running = self.docker.containers.list(filters={"status": "running"})  # not paused ones
        return sum(1 for c in running if not (c.name or "").startswith(self.prefix))

    async def attach(self, app: web.Application) -> None:
        """Join the app's sandbox network (created if need be), as its own containers do."""
        driver = app[keys.DRIVER]
        assert isinstance(driver, DockerDriver)
        assert driver.networks is not None
        self.attachment = await driver.networks.prepare(network_policy(self.spec))
        self.webhook_port = app[keys.WEBHOOK_LISTENER].port

    def raw_request(self, owner: str = "bench") -> ContainerRequest:
        """The very container the API would ask for (a new record of the default spec), under
        the raw prefix, on the attached network."""
        record = SandboxRecord.starting(naming.new_sandbox_id(), owner, self.spec.id)
        config = self.api_config or self.config()
        webhooks = f"http://{HOST_GATEWAY}:{self.webhook_port}" if self.webhook_port else None
        request = sandbox_request(config, record, self.spec, webhooks)
        return container_request(request, self.raw_prefix, publish_host(config), self.attachment)

    def raw_create_start(self, req: ContainerRequest) -> tuple[Any, Any, float, int]:
        """Volume, container, start, inspect (for the port): the driver's engine calls, with its
        own argument translation (drivers/docker/containers.py), no control plane. Returns the
        volume, the container, the perf time it started and its agent server's host port."""
        volume = self.docker.volumes.create(name=req.volume, labels=req.labels)
        container_id = create_container(self.docker, req)
        self.docker.api.start(container_id)
        started = time.perf_counter()
        attrs = self.docker.api.inspect_container(container_id)
        container = self.docker.containers.prepare_model(attrs)
        port = self.spec.exposed_ports[AGENT_SERVER]
        host_port = int(attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]["HostPort"])
        return volume, container, started, host_port

    async def health(self, port: int) -> float:
        """Poll the agent's /health every RAW_HEALTH_POLL until 200; the perf time of that 200."""
        assert self.health_http is not None
        deadline = time.monotonic() + STATUS_TIMEOUT
        url = f"http://127.0.0.1:{port}/health"
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with self.health_http.get(
                    url, timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    if resp.status == 200:
                        return time.perf_counter()
            await asyncio.sleep(RAW_HEALTH_POLL)
        raise BenchError(f"raw container on port {port}: no 200 on /health")

    def remove_everything(self) -> int:
        """Remove every container and volume whose name holds the run's prefix, and the app's
        sandbox networks with their firewall rules; how many containers and volumes."""
        removed = 0
        for _ in range(2):  # a launch thread still running at shutdown may create one late
            found = remove_matching(self.docker, self.prefix)
            removed += found
            if not found:
                break
            time.sleep(1.0)
        return removed

    def close(self) -> None:
        self.docker.close()


# -- main ----------------------------------------------------------------------------------------


class Benchmark(Protocol):
    notes: list[str]

    async def measure(self) -> tuple[list[str], list[str]]:
        """Run everything; the table's lines and the targets missed."""
        ...

    def remove_everything(self) -> int: ...

    def close(self) -> None: ...

    def results(self) -> Any:
        """What --json writes."""
        ...


async def _measure(bench: Benchmark) -> tuple[list[str], list[str]]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await bench.measure()


def run_main(
    make: Callable[[Path, str], Benchmark], *, tmp_prefix: str, json_path: Path | None
) -> int:
    """Run the benchmark `make(tmp, redis_url)` builds against a private redis-server; print
    its table, notes and targets; write its results to `json_path`. The exit status."""
    # ACS_BENCH_LOG_LEVEL=info: the services' timing events (phases) on stderr beside the table.
    configure_logging("json", os.environ.get("ACS_BENCH_LOG_LEVEL", "warning"), stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp:
        server = RedisServer(Path(tmp) / "redis")
        bench: Benchmark | None = None
        try:
            try:
                server.start()
            except RuntimeError as exc:
                raise BenchError(str(exc)) from None
            bench = make(Path(tmp), server.url)
            lines, missed = asyncio.run(_measure(bench))
        except (BenchError, DockerException) as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("bench: interrupted", file=sys.stderr)
            return 130
        finally:
            if bench is not None:
                with contextlib.suppress(NotFound, APIError, DockerException):
                    removed = bench.remove_everything()
                    if removed:
                        bench.notes.append(f"removed {removed} leftover containers/volumes at exit")
                        print(f"bench: removed {removed} leftovers", file=sys.stderr)
                bench.close()
            server.stop()
    print()
    print("\n".join(lines))
    print()
    if bench.notes:
        print("notes: " + "; ".join(sorted(set(bench.notes), key=bench.notes.index)))
    print(f"load avg at the end: {os.getloadavg()[0]:.2f}")
    print("all targets met" if not missed else "MISSED: " + "; ".join(missed))
    if json_path is not None:
        json_path.write_text(json.dumps(bench.results(), indent=1))
    return 0


class Opts(Protocol):
    @property
    def json_path(self) -> Path | None: ...


OptsT = TypeVar("OptsT", bound=Opts)


def main_of(
    parse: Callable[[list[str] | None], OptsT],
    make: Callable[[OptsT, Path, str], Benchmark],
    tmp_prefix: str,
) -> Callable[[list[str] | None], int]:
    """A benchmark's main: its options parsed, then run_main with the bench `make` builds."""

    def main(argv: list[str] | None = None) -> int:
        options = parse(argv)
        return run_main(
            lambda tmp, url: make(options, tmp, url),
            tmp_prefix=tmp_prefix,
            json_path=options.json_path,
        )

    return main
