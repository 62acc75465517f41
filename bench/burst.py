"""A burst of sandboxes: N requested at once by U users, each timed from its request to the output
of its first command through the agent server (ComputeSDK's "time to interactive"), beside the
same burst of raw `docker run` + first exec measured in the same run (issue 30).

Run with `.venv/bin/python -m bench.burst` (100 sandboxes, 10 users), `--count 20` on a shared
machine, `--modes pool,half,cold` to choose. bench/README.md says what is measured and how.

Modes, each against a control plane of its own (`controlplane serve` in a process of its own,
so the client's work is not on its event loop, on the run's private redis-server):
- pool: ACS_WARM_POOL=N, the pool full before the burst; then its floor: the same first command
  sent at once straight to the N agent servers, all running (no control plane);
- half: ACS_WARM_POOL=N/2 (half claimed, half started cold);
- cold: no pool; and, with that server idle just before its burst, the raw burst: N containers
  made at once with the Docker driver's own engine calls (bench/common.py), each timed to the
  output of `docker exec <container> echo` and, on the same container, to the output of the
  same first command through its agent server.

Every API client polls its user's sandboxes in one batch GET every `--poll` seconds (20 ms)
until RUNNING, then runs `echo` through the sandbox's agent server
(POST /api/bash/execute_bash_command with the sandbox's session key). Quotas are on and sized to
fit (N/U running sandboxes per user); the per-key rate limit is off. An error is any answer
other than 200 (a 429/503 is timed: admission must refuse before anyone waits), a sandbox that
ends ERROR, or no output within `--timeout`. Targets (Docker): pool p95 <= 600 ms, 0 errors in
every mode, cold p95 <= 1.3x the raw burst's p95 (docker run + exec). Exit status as
bench/common.run_main: 0 when the table was printed, missed targets marked in it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import docker

from bench.common import (
    REPO,
    BenchError,
    Deployment,
    Samples,
    host_busy,
    main_of,
    ms,
    process_cpu,
    process_tree,
)
from controlplane.sandboxes.launcher import network_policy
from drivers.docker.egress import Attachment, network_name
from drivers.egress import HOST_GATEWAY
from tests.support.live_server import free_port

TARGET_POOL_P95 = 0.600
TARGET_COLD_RATIO = 1.3
COMMAND = "echo interactive"
EXPECTED = "interactive"
EXEC_PATH = "/api/bash/execute_bash_command"
POOL_FILL_TIMEOUT = 1800.0
LOG_EVENTS = ("store_busy", "redis_unavailable", "request_failed", "unhandled_error")


@dataclass
class Options:
    count: int
    users: int
    poll: float
    timeout: float
    modes: list[str]
    json_path: Path | None
    runtime: str = "docker"
    starts: int | None = None  # ACS_MAX_CONCURRENT_STARTS for the control plane; None: unset
    refill_delay: float | None = None  # ACS_POOL_REFILL_DELAY; None: unset (the default)
    phases: bool = False  # the server logs its requests: each POST's time in its handler
    profile: Path | None = None  # each mode's control plane under cProfile, its stats here
    control_plane: Path | None = None  # the `controlplane` to run (another worktree's venv)
    workers: int | None = None  # ACS_WORKERS for the control planes; None: unset (1)
    event_loop: str | None = None  # ACS_EVENT_LOOP for the control planes; None: unset


@dataclass
class Outcome:
    """One sandbox of a burst: seconds to its first command's output, or its error."""

    seconds: float | None = None
    error: str | None = None
    refused_after: float | None = None  # a 429/503: how long the refusal took
    claimed: bool = False
    running: float | None = None  # request -> RUNNING seen by the client
    answered: float | None = None  # request -> the POST's answer
    request_id: str | None = None  # the POST's X-Request-ID (its server log line)
    agent: tuple[str, str] | None = None  # its agent server's URL and session key


@dataclass
class ModeResult:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    load_before: float = 0.0
    load_after: float = 0.0
    wall: float = 0.0
    log_events: dict[str, int] = field(default_factory=dict)
    server_cpu: float | None = None
    server_waited: float | None = None  # seconds its threads were runnable but had no core
    client_cpu: float | None = None  # this process's CPU over the burst (the clients' work)
    host_busy: float | None = None  # CPU seconds all the host's cores were busy over the burst
    idle_cpu: float | None = None  # the control plane's CPU a second in the settle before it


class Server:
    """`controlplane serve` of one mode, on the run's Redis, logging to a file."""

    def __init__(self, deploy: Deployment, tmp: Path, env: dict[str, str]) -> None:
        self.deploy = deploy
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"server-{self.port}.log"
        self.env = env
        self.log_level = "warning"  # "info" (--phases): a `request` line per request
        self.profile: Path | None = None  # where cProfile writes the server's stats (--profile)
        self.binary: Path | None = None  # `controlplane` of another venv (--control-plane)
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, http: aiohttp.ClientSession) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACS_")}
        env.update(
            {
                "ACS_REDIS_URL": self.deploy.redis_url,
                "ACS_BOOTSTRAP_API_KEY": self.deploy.bootstrap_key,
                "ACS_SECRET_KEY": self.deploy.secret_key,
                "ACS_CONTAINER_PREFIX": self.deploy.prefix,
                "ACS_SPEC_DIR": str(REPO / "specs"),
                "ACS_DATA_DIR": str(self.deploy.tmp / "data"),
                "ACS_LOG_LEVEL": self.log_level,
                "ACS_LOG_FORMAT": "json",
                "ACS_RATE_LIMIT_PER_MINUTE": "0",
                **({"ACS_IMAGE_TAG": self.deploy.image_tag} if self.deploy.image_tag else {}),
                **self.env,
            }
        )
        command = [str(self.binary or Path(sys.executable).parent / "controlplane")]
        if self.profile is not None and self.binary is None:
            # cProfile writes its stats when the server exits (SIGTERM: a clean stop).
            code = (
                "import cProfile; from controlplane.cli import main; "
                f"cProfile.run('main()', {str(self.profile)!r})"
            )
            command = [sys.executable, "-c", code]
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *command,
                *("serve", "--host", "127.0.0.1", "--port", str(self.port)),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(f"{self.url}/ready") as resp:
                    if resp.status == 200:
                        return
            if self.process.returncode is not None:
                raise BenchError(f"the control plane exited; see {self.log}")
            await asyncio.sleep(0.2)
        raise BenchError(f"the control plane was not ready in 60 s; see {self.log}")

    def cpu(self) -> float:
        """CPU seconds the control plane's processes have used (user + system): `serve` and,
        under ACS_WORKERS, its workers."""
        assert self.process is not None
        total = 0.0
        for pid in process_tree(self.process.pid):
            with contextlib.suppress(OSError):
                total += process_cpu(pid)
        return total

    def handler_seconds(self) -> dict[str, float]:
        """Each POST /api/v1/sandboxes' time in the server's middlewares and handler (its
        `request` log line, at log level info), by X-Request-ID."""
        found: dict[str, float] = {}
        if not self.log.exists():
            return found
        for line in self.log.read_text(errors="replace").splitlines():
            if '"event": "request"' not in line or '"method": "POST"' not in line:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(line)
                if row["path"] == "/api/v1/sandboxes":
                    found[row["request_id"]] = row["duration_ms"] / 1000
        return found

    def waited(self) -> float:
        """Seconds the control plane's threads have waited runnable for a core
        (/proc/<pid>/task/*/schedstat, second field, in ns)."""
        assert self.process is not None
        total = 0
        for pid in process_tree(self.process.pid):
            for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int(stat.read_text().split()[1])
        return total / 1e9

    def events(self) -> dict[str, int]:
        """How many log lines of each LOG_EVENTS the server wrote."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return {name: text.count(f'"event": "{name}"') for name in LOG_EVENTS}

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def stop_server(server: Server) -> None:
    """`server.stop` without a loop (a run's last clean-up, also after an interruption)."""
    process = server.process
    if process is not None and process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
            for _ in range(300):
                try:
                    pid, _status = os.waitpid(process.pid, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid:
                    return
                time.sleep(0.1)
            os.kill(process.pid, signal.SIGKILL)


class UserPoller:
    """One user's client: its STARTING sandboxes polled in one batch GET every `poll` s."""

    def __init__(self, http: aiohttp.ClientSession, url: str, key: str, poll: float) -> None:
        self.http = http
        self.url = url
        self.headers = {"X-Session-API-Key": key}
        self.poll = poll
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.task: asyncio.Task[None] | None = None

    def wait(self, sandbox_id: str) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[sandbox_id] = future
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run())
        return future

    async def _run(self) -> None:
        while self.waiting:
            ids = list(self.waiting)[:100]
            query = "&".join(f"id={i}" for i in ids)
            try:
                async with self.http.get(
                    f"{self.url}/api/v1/sandboxes?{query}", headers=self.headers
                ) as resp:
                    bodies = await resp.json() if resp.status == 200 else []
            except (aiohttp.ClientError, OSError):
                bodies = []
            for body in bodies:
                if not body or body["id"] not in self.waiting:
                    continue
                if body["status"] in ("RUNNING", "ERROR", "MISSING"):
                    future = self.waiting.pop(body["id"])
                    if not future.done():
                        future.set_result(body)
            await asyncio.sleep(self.poll)


class BurstBench:
    RUNTIME = "Docker"
    RAW_LABEL = "raw docker"
    RAW_WHAT = "docker run + docker exec"
    RAW_KEY = "raw.exec"
    """The raw burst's samples the cold one is compared with."""
    TARGET_COLD = TARGET_COLD_RATIO
    TARGET_POOL: float | None = TARGET_POOL_P95
    """The pool's p95 target (Docker's; on Kubernetes the issue sets only the ratio)."""

    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.opt = options
        self.tmp = tmp
        prefix = f"acs-bench-burst-{os.urandom(3).hex()}-"
        self.deploy = Deployment(tmp, redis_url, prefix)
        # Raw containers are made all at once: a connection per thread.
        self.deploy.docker.close()
        self.deploy.docker = docker.from_env(timeout=300, max_pool_size=options.count + 8)
        self.notes = self.deploy.notes
        self.samples = Samples()
        self.results_by_mode: dict[str, ModeResult] = {}
        self.floor_busy: tuple[float, float] | None = None  # (host CPU s busy, wall s): floor

    # -- Benchmark protocol ----------------------------------------------------------------

    def results(self) -> Any:
        return {
            **self.samples.values,
            "modes": {
                name: {
                    "errors": [o.error for o in r.outcomes if o.error],
                    "load_before": r.load_before,
                    "load_after": r.load_after,
                    "log_events": r.log_events,
                }
                for name, r in self.results_by_mode.items()
            },
        }

    def remove_everything(self) -> int:
        return self.deploy.remove_everything()

    def close(self) -> None:
        self.deploy.close()

    async def setup(self) -> None:
        """Before the first mode: the engine checked, the environment printed."""
        self.deploy.preflight()
        print(self.deploy.environment(), flush=True)
        print(f"prefix {self.deploy.prefix}", file=sys.stderr)
        self.note_settings()

    def note_settings(self) -> None:
        """The start bound and the refill delay the control planes run with, in the notes."""
        starts = self.opt.starts
        self.notes.append(
            "boots at once per control plane: "
            + (
                f"ACS_MAX_CONCURRENT_STARTS={starts}"
                if starts is not None
                else "ACS_MAX_CONCURRENT_STARTS unset (no bound on Kubernetes)"
                if self.opt.runtime == "kubernetes"
                else "ACS_MAX_CONCURRENT_STARTS unset (Docker: 2 per CPU of this host, "
                f"{2 * (os.cpu_count() or 1)} here; 25 per slot may wait)"
            )
        )

        binary = self.opt.control_plane or Path(sys.executable).parent / "controlplane"
        tree = binary.resolve().parents[2]  # <worktree>/.venv/bin/controlplane
        commit = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        self.notes.append(f"control plane: {tree} at {commit or '?'}")

        self.notes.append(
            (f"ACS_WORKERS={self.opt.workers}" if self.opt.workers else "ACS_WORKERS unset (1)")
            + (
                f", ACS_EVENT_LOOP={self.opt.event_loop}"
                if self.opt.event_loop
                else ", ACS_EVENT_LOOP unset"
            )
        )
        delay = self.opt.refill_delay
        self.notes.append(
            "the pool's refill after claims: "
            + (
                f"ACS_POOL_REFILL_DELAY={delay:g}"
                if delay is not None
                else "ACS_POOL_REFILL_DELAY unset (its default)"
            )
        )

    def runtime_env(self, mode: str) -> dict[str, str]:
        """The control plane's settings for the runtime of `mode` (Docker: the defaults)."""
        return {}

    async def clean_mode(self, mode: str) -> None:
        """Untimed, after a mode: everything it made removed."""
        await asyncio.to_thread(self.deploy.remove_everything)

    async def measure(self) -> tuple[list[str], list[str]]:
        await self.setup()
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=self.opt.count + 8))
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as http:
            self.deploy.health_http = http
            try:
                for mode in self.opt.modes:
                    await self.run_mode(http, mode)
            finally:
                await self.deploy.redis.aclose()
        return self.table()

    # -- one mode ----------------------------------------------------------------------------

    def pool_size(self, mode: str) -> int:
        return {"pool": self.opt.count, "half": self.opt.count // 2}.get(mode, 0)

    async def run_mode(self, http: aiohttp.ClientSession, mode: str) -> None:
        await self.deploy.redis.flushall()
        per_user = math.ceil(self.opt.count / self.opt.users)
        size = self.pool_size(mode)
        server = Server(
            self.deploy,
            self.tmp,
            {
                "ACS_WARM_POOL": str(size),
                "ACS_MAX_RUNNING_PER_USER": str(per_user),
                "ACS_MAX_SANDBOXES_PER_USER": str(per_user),
                **self.runtime_env(mode),
                **(
                    {"ACS_MAX_CONCURRENT_STARTS": str(self.opt.starts)}
                    if self.opt.starts is not None
                    else {}
                ),
                **(
                    {"ACS_POOL_REFILL_DELAY": f"{self.opt.refill_delay:g}"}
                    if self.opt.refill_delay is not None
                    else {}
                ),
                **({"ACS_WORKERS": str(self.opt.workers)} if self.opt.workers else {}),
                **({"ACS_EVENT_LOOP": self.opt.event_loop} if self.opt.event_loop else {}),
            },
        )
        if self.opt.phases:
            server.log_level = "info"
        server.binary = self.opt.control_plane
        if self.opt.profile is not None:
            self.opt.profile.mkdir(parents=True, exist_ok=True)
            server.profile = self.opt.profile / f"{mode}.prof"
        print(f"{mode}: starting the control plane (pool {size})", file=sys.stderr)
        await server.start(http)
        try:
            keys = [await self.deploy.user_key(f"burst-{u}") for u in range(self.opt.users)]
            if size:
                await self.pool_full(http, server.url, size)
            if mode == "cold":
                await self.raw_burst(http)
            idle_from, idle_cpu = time.perf_counter(), server.cpu()
            await asyncio.sleep(1.0)  # untimed: what the set-up left running settles
            idle_cpu = (server.cpu() - idle_cpu) / (time.perf_counter() - idle_from)
            result = await self.api_burst(http, server, mode, keys)
            result.idle_cpu = idle_cpu
            self.results_by_mode[mode] = result
        finally:
            await server.stop()
            await self.clean_mode(mode)

    async def pool_full(
        self, http: aiohttp.ClientSession, url: str, size: int, what: str = "filled"
    ) -> None:
        """Until `size` members of the default spec are ready to be claimed (noted, untimed)."""
        headers = {"X-Session-API-Key": self.deploy.bootstrap_key}
        deadline = time.monotonic() + POOL_FILL_TIMEOUT
        started, last = time.monotonic(), -1
        while time.monotonic() < deadline:
            async with http.get(f"{url}/api/v1/sandbox-pool", headers=headers) as resp:
                view = await resp.json()
            spec = next(s for s in view["specs"] if s["spec_id"] == self.deploy.spec.id)
            ready = sum(1 for m in spec["members"] if m["ready"])
            if ready != last:
                print(f"  pool: {ready}/{size} ready", file=sys.stderr)
                last = ready
            if ready >= size:
                self.notes.append(
                    f"the pool of {size} {what} in {time.monotonic() - started:.0f} s (untimed)"
                )
                return
            await asyncio.sleep(0.5)
        raise BenchError(f"the pool did not fill ({last}/{size}) in {POOL_FILL_TIMEOUT:.0f} s")

    async def api_burst(
        self, http: aiohttp.ClientSession, server: Server, mode: str, keys: list[str]
    ) -> ModeResult:
        pollers = [UserPoller(http, server.url, key, self.opt.poll) for key in keys]
        result = ModeResult(mode, load_before=os.getloadavg()[0])
        cpu, waited, client = server.cpu(), server.waited(), time.process_time()
        busy = host_busy()
        print(f"{mode}: {self.opt.count} sandboxes at once", file=sys.stderr)
        started = time.perf_counter()
        outcomes = await asyncio.gather(
            *(
                self.one_sandbox(http, server.url, pollers[n % len(pollers)])
                for n in range(self.opt.count)
            )
        )
        result.wall = time.perf_counter() - started
        result.host_busy = host_busy() - busy
        result.server_cpu = server.cpu() - cpu
        result.server_waited = server.waited() - waited
        result.client_cpu = time.process_time() - client
        result.load_after = os.getloadavg()[0]
        result.outcomes = list(outcomes)
        result.log_events = server.events()
        if mode == "pool":
            # The pool back to its size (its guarantee), then the floor on a settled host.
            await self.pool_full(
                http, server.url, self.pool_size(mode), what="refilled after the burst"
            )
            await self.floor_burst(http, [o.agent for o in outcomes if o.agent is not None])
        handled = server.handler_seconds() if self.opt.phases else {}
        for o in outcomes:
            if o.seconds is not None:
                self.samples.add(f"{mode}.interactive", o.seconds)
            if o.running is not None:
                self.samples.add(f"{mode}.running", o.running)
            if o.answered is not None and o.error is None:
                self.samples.add(f"{mode}.post", o.answered)
            if o.seconds is not None and o.running is not None:
                self.samples.add(f"{mode}.first", o.seconds - o.running)
            inside = handled.get(o.request_id or "")
            if inside is not None and o.answered is not None and o.error is None:
                self.samples.add(f"{mode}.handler", inside)
                self.samples.add(f"{mode}.outside", o.answered - inside)
        for poller in pollers:
            if poller.task is not None:
                poller.task.cancel()
        await self.delete_all(http, server.url, pollers)
        return result

    async def floor_burst(self, http: aiohttp.ClientSession, agents: list[tuple[str, str]]) -> None:
        """The pool mode's floor: the same first command sent at once straight to the burst's
        agent servers, all running already (no control plane, no poll): what the host's cores
        make of N agent servers answering at once."""
        await asyncio.sleep(1.0)  # what the burst left running settles, as before each burst

        async def one(url: str, key: str) -> None:
            t0 = time.perf_counter()
            output = await self.first_command(http, url, key)
            if EXPECTED in output:
                self.samples.add("pool.floor", time.perf_counter() - t0)

        busy, started = host_busy(), time.perf_counter()
        await asyncio.gather(*(one(url, key) for url, key in agents), return_exceptions=True)
        self.floor_busy = (host_busy() - busy, time.perf_counter() - started)

    async def one_sandbox(
        self, http: aiohttp.ClientSession, url: str, poller: UserPoller
    ) -> Outcome:
        request_id = os.urandom(8).hex()
        outcome = Outcome(request_id=request_id)
        headers = {**poller.headers, "X-Request-ID": request_id}
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.opt.timeout):
                async with http.post(f"{url}/api/v1/sandboxes", headers=headers, json={}) as resp:
                    body = await resp.json(content_type=None)
                    outcome.answered = time.perf_counter() - t0
                    if resp.status != 200:
                        outcome.error = f"POST {resp.status}: {body.get('detail')}"
                        if resp.status in (429, 503):
                            outcome.refused_after = time.perf_counter() - t0
                        return outcome
                outcome.claimed = body["status"] == "RUNNING"
                if body["status"] != "RUNNING":
                    body = await poller.wait(body["id"])
                    if body["status"] != "RUNNING":
                        outcome.error = f"{body['status']}: {body.get('reason')}"
                        return outcome
                outcome.running = time.perf_counter() - t0
                outcome.agent = (body["exposed_urls"][0]["url"], body["session_api_key"])
                output = await self.first_command(
                    http, body["exposed_urls"][0]["url"], body["session_api_key"]
                )
                if EXPECTED not in output:
                    outcome.error = f"first command answered {output[:80]!r}"
                    return outcome
                outcome.seconds = time.perf_counter() - t0
        except TimeoutError:
            outcome.error = f"no output within {self.opt.timeout:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
        return outcome

    @staticmethod
    async def first_command(http: aiohttp.ClientSession, agent_url: str, key: str) -> str:
        async with http.post(
            f"{agent_url.rstrip('/')}{EXEC_PATH}",
            headers={"X-Session-API-Key": key},
            json={"command": COMMAND},
        ) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                return f"{resp.status} {body}"
            return str(body.get("stdout", ""))

    async def delete_all(
        self, http: aiohttp.ClientSession, url: str, pollers: list[UserPoller]
    ) -> None:
        """Untimed: every user's sandboxes deleted through the API."""
        for poller in pollers:
            async with http.get(
                f"{url}/api/v1/sandboxes/search?limit=100", headers=poller.headers
            ) as resp:
                found = (await resp.json())["items"] if resp.status == 200 else []
            await asyncio.gather(
                *(
                    http.delete(f"{url}/api/v1/sandboxes/{s['id']}", headers=poller.headers)
                    for s in found
                ),
                return_exceptions=True,
            )

    # -- the raw burst -----------------------------------------------------------------------

    def attach(self) -> None:
        """Raw containers join the sandbox network the control plane made at start."""
        name = network_name(self.deploy.prefix, network_policy(self.deploy.spec))
        for _ in range(600):  # the control plane makes it just after it starts serving
            with contextlib.suppress(docker.errors.NotFound):
                net = self.deploy.docker.networks.get(name)
                break
            time.sleep(0.1)
        else:
            raise BenchError(f"the control plane made no network {name} in 60 s")
        gateway = str(net.attrs["IPAM"]["Config"][0]["Gateway"])
        self.deploy.attachment = Attachment(str(net.name), gateway, {HOST_GATEWAY: gateway})
        self.deploy.webhook_port = None  # raw agents announce themselves to no one

    async def raw_burst(self, http: aiohttp.ClientSession) -> None:
        await asyncio.to_thread(self.attach)
        await self.timed_raw("containers", lambda: self.one_raw(http))
        await asyncio.to_thread(self.raw_remove_all)

    async def timed_raw(self, what: str, one: Callable[[], Awaitable[Outcome]]) -> None:
        """`--count` of `one()` at once: the raw burst's outcomes, wall time and load."""
        result = ModeResult("raw", load_before=os.getloadavg()[0])
        print(f"raw: {self.opt.count} {what} at once", file=sys.stderr)
        started = time.perf_counter()
        made = await asyncio.gather(*(one() for _ in range(self.opt.count)), return_exceptions=True)
        result.wall = time.perf_counter() - started
        result.load_after = os.getloadavg()[0]
        for item in made:
            if isinstance(item, BaseException):
                result.outcomes.append(Outcome(error=f"{type(item).__name__}: {item}"))
            else:
                result.outcomes.append(item)
        self.results_by_mode["raw"] = result

    async def one_raw(self, http: aiohttp.ClientSession) -> Outcome:
        req = self.deploy.raw_request()
        key = req.env["OH_SESSION_API_KEYS_0"]
        t0 = time.perf_counter()
        _volume, container, _started, port = await asyncio.to_thread(
            self.deploy.raw_create_start, req
        )
        code, output = await asyncio.to_thread(container.exec_run, COMMAND.split())
        t_exec = time.perf_counter()
        if code != 0 or EXPECTED not in output.decode(errors="replace"):
            return Outcome(error=f"docker exec: {code} {output[:80]!r}")
        self.samples.add("raw.exec", t_exec - t0)
        await self.raw_health(http, port)
        answer = await self.first_command(http, f"http://127.0.0.1:{port}", key)
        if EXPECTED not in answer:
            return Outcome(error=f"raw agent answered {answer[:80]!r}")
        seconds = time.perf_counter() - t0
        self.samples.add("raw.agent", seconds)
        return Outcome(seconds=t_exec - t0)

    async def raw_health(self, http: aiohttp.ClientSession, port: int) -> None:
        """/health polled every `--poll` s until 200, as often as the API's clients poll (the
        common helper's 5 ms, times N containers, would load the host the boots share)."""
        url = f"http://127.0.0.1:{port}/health"
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(self.opt.poll)

    def raw_remove_all(self) -> None:
        prefix = self.deploy.raw_prefix
        for c in self.deploy.docker.containers.list(all=True, filters={"name": prefix}):
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True, v=True)
        for v in self.deploy.docker.volumes.list(filters={"name": prefix}):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                v.remove(force=True)

    # -- the table ---------------------------------------------------------------------------

    def table(self) -> tuple[list[str], list[str]]:
        n, users = self.opt.count, self.opt.users
        lines = [
            f"{self.RUNTIME}: burst of {n} sandboxes from {users} users, request -> first "
            f"command's output (`{COMMAND}`) through the agent server; raw: {self.RAW_WHAT}",
            "mode            | done | p50 ms  | p95 ms  | max ms  | errors | from pool | "
            "RUNNING p50 ms | load before/after | server CPU s | store_busy / redis_unavailable",
        ]
        missed: list[str] = []
        for name, r in self.results_by_mode.items():
            label = {"cold": "cold", "raw": self.RAW_LABEL}.get(
                name, f"pool of {self.pool_size(name)}"
            )
            key = self.RAW_KEY if name == "raw" else f"{name}.interactive"
            errors = [o.error for o in r.outcomes if o.error]
            claimed = sum(1 for o in r.outcomes if o.claimed)
            cpu = f"{r.server_cpu:.1f}" if r.server_cpu is not None else "-"
            logged = (
                f"{r.log_events.get('store_busy', 0)} / {r.log_events.get('redis_unavailable', 0)}"
                if name != "raw"
                else "-"
            )
            lines.append(
                f"{label:<15} | {self.samples.count(key):>4} | {ms(self.samples.p(key, 50)):>7} | "
                f"{ms(self.samples.p(key, 95)):>7} | {ms(self.samples.p(key, 100)):>7} | "
                f"{len(errors):>6} | {claimed if name != 'raw' else '-':>9} | "
                f"{ms(self.samples.p(f'{name}.running', 50)):>14} | "
                f"{r.load_before:.1f} / {r.load_after:.1f}{'':>8} | {cpu:>12} | {logged}"
            )
            if errors:
                missed.append(f"{label}: {len(errors)} errors")
                shown = sorted(set(errors))[:5]
                lines.append(f"  errors ({len(errors)}): " + "; ".join(shown))
                refusals = [o.refused_after for o in r.outcomes if o.refused_after is not None]
                if refusals:
                    lines.append(
                        f"  429/503 answered within {ms(max(refusals))} ms at most "
                        "(admission refuses before anyone waits)"
                    )
        if "raw" in self.results_by_mode and self.RAW_KEY != "raw.agent":
            lines.append(
                f"raw docker run + the same first command through its agent server: p50 "
                f"{ms(self.samples.p('raw.agent', 50))} ms, p95 "
                f"{ms(self.samples.p('raw.agent', 95))} ms, max "
                f"{ms(self.samples.p('raw.agent', 100))} ms"
            )
        if "pool" in self.results_by_mode and self.TARGET_POOL is not None:
            p95 = self.samples.p("pool.interactive", 95)
            ok = p95 <= self.TARGET_POOL
            lines.append(
                f"pool p95 {ms(p95)} ms: {'ok' if ok else 'MISSED'} (target <= "
                f"{self.TARGET_POOL * 1000:.0f} ms, below Daytona's published 611 ms)"
            )
            if not ok:
                missed.append(f"pool p95 {ms(p95)} ms > {self.TARGET_POOL * 1000:.0f} ms")
            if self.samples.count("pool.floor"):
                floor = self.samples.p("pool.floor", 95)
                lines.append(
                    f"floor: `{COMMAND}` sent at once straight to the "
                    f"{self.samples.count('pool.floor')} running agent servers (no control "
                    f"plane): p50 {ms(self.samples.p('pool.floor', 50))} ms, p95 {ms(floor)} ms, "
                    f"max {ms(self.samples.p('pool.floor', 100))} ms; pool p95 / floor p95 "
                    f"{p95 / floor:.2f}x"
                )
        if "cold" in self.results_by_mode and "raw" in self.results_by_mode:
            for q in (50, 95):
                cold, raw = self.samples.p("cold.interactive", q), self.samples.p(self.RAW_KEY, q)
                ratio = cold / raw if raw else float("nan")
                mark = "ok" if ratio <= self.TARGET_COLD else "MISSED"
                lines.append(
                    f"cold p{q} / raw p{q}: {ratio:.2f}x {mark} (target <= {self.TARGET_COLD}x)"
                )
                if q == 95 and ratio > self.TARGET_COLD:
                    missed.append(f"cold p95 {ratio:.2f}x raw > {self.TARGET_COLD}x")
        for name, r in self.results_by_mode.items():
            lines.append(f"  {name}: the burst took {r.wall:.1f} s wall clock")
            lines.extend(self.phases(name))
        return lines, missed

    def phases(self, mode: str) -> list[str]:
        """Where a sandbox's time went in `mode` (the handler's share with --phases); none for
        the raw burst."""
        phases = [
            ("POST answered", "post"),
            ("in the server's handler", "handler"),
            ("outside it (HTTP, waiting for the loop)", "outside"),
            ("RUNNING -> first command's output", "first"),
        ]
        shown = [
            f"{label} {ms(self.samples.p(f'{mode}.{key}', 50))} / "
            f"{ms(self.samples.p(f'{mode}.{key}', 95))}"
            for label, key in phases
            if self.samples.count(f"{mode}.{key}")
        ]
        if mode == "raw":
            return []
        r = self.results_by_mode[mode]
        cpu = (
            f"    CPU over the burst: the control plane {r.server_cpu:.2f} s, its threads "
            f"waited {r.server_waited:.2f} s for a core; the clients (this process) "
            f"{r.client_cpu:.2f} s"
            + (
                f"; the control plane idle just before it (its pool's passes, sweeps): "
                f"{r.idle_cpu * 1000:.0f} ms of CPU a second"
                if r.idle_cpu is not None
                else ""
            )
            if r.server_cpu is not None and r.server_waited is not None and r.client_cpu is not None
            else ""
        )
        cores = os.cpu_count() or 1
        host = (
            f"    the host's {cores} cores over the burst: busy {r.host_busy:.2f} s of CPU in "
            f"{r.wall:.2f} s ({100 * r.host_busy / (cores * r.wall):.0f} % of what they had)"
            if r.host_busy is not None and r.wall
            else ""
        )
        if host and mode == "pool" and self.floor_busy is not None:
            busy, wall = self.floor_busy
            host += (
                f"; over the floor's burst: busy {busy:.2f} s in {wall:.2f} s "
                f"({100 * busy / (cores * wall):.0f} %)"
            )
        return [
            f"    phases p50 / p95 ms: {'; '.join(shown)}",
            *([cpu] if cpu else []),
            *([host] if host else []),
        ]


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="sandboxes in the burst (100)")
    parser.add_argument("--users", type=int, default=10, help="users they belong to (10)")
    parser.add_argument("--poll", type=float, default=0.02, help="each user's poll (0.02 s)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per sandbox (300 s)")
    parser.add_argument("--modes", default="pool,half,cold", help="pool,half,cold")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument(
        "--starts",
        type=int,
        default=None,
        help="ACS_MAX_CONCURRENT_STARTS for the control plane (unset: its default; 0: no bound)",
    )
    parser.add_argument(
        "--runtime",
        choices=("docker", "kubernetes"),
        default="docker",
        help="docker (the local engine) or kubernetes (the two-node test cluster, as root)",
    )
    parser.add_argument(
        "--refill-delay",
        type=float,
        default=None,
        help="ACS_POOL_REFILL_DELAY for the control planes (unset: its default; 0: the pool "
        "refills at once after each claim, as before it existed)",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="the servers log at info: each POST's time inside its handler is printed",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="run each control plane under cProfile; DIR/<mode>.prof (slower: for where the "
        "time goes, not for the figures)",
    )
    parser.add_argument(
        "--control-plane",
        type=Path,
        default=None,
        help="the `controlplane` executable the modes run (another worktree's .venv/bin/"
        "controlplane: its code measured by this bench, e.g. main beside a branch); default "
        "this venv's",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="ACS_WORKERS for the control planes (unset: 1, no supervisor)",
    )
    parser.add_argument(
        "--event-loop",
        choices=("asyncio", "uvloop"),
        default=None,
        help="ACS_EVENT_LOOP for the control planes (unset: their default)",
    )
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be positive")
    if args.control_plane is not None and args.profile is not None:
        parser.error("--profile runs this venv's control plane: not with --control-plane")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("pool", "half", "cold") for m in modes):
        parser.error("--modes takes pool, half and cold")
    if args.count < 1 or args.users < 1:
        parser.error("--count and --users must be positive")
    return Options(
        args.count,
        args.users,
        args.poll,
        args.timeout,
        modes,
        args.json_path,
        args.runtime,
        args.starts,
        args.refill_delay,
        args.phases,
        args.profile,
        args.control_plane,
        args.workers,
        args.event_loop,
    )


def make_bench(options: Options, tmp: Path, redis_url: str) -> BurstBench:
    if options.runtime == "kubernetes":
        # Imported here: bench.burst_kube builds on this module.
        from bench.burst_kube import KubeBurstBench  # noqa: PLC0415

        return KubeBurstBench(options, tmp, redis_url)
    return BurstBench(options, tmp, redis_url)


main = main_of(parse, make_bench, "acs-burst-")

if __name__ == "__main__":
    sys.exit(main(None))
