"""LLM gateway benchmark: what the gateway adds to a model call, against calling the scripted
model directly in the same run, and whether it changes conversation READY from the warm pool.

    .venv/bin/python -m bench.llm_gateway [--calls N] [--ready-runs N] [--quick] [--no-ready]

Overhead (no Docker): a private redis-server, the real app over real HTTP on 127.0.0.1, and the
scripted OpenAI-compatible model (tests/support/fake_llm.py) on 127.0.0.1. The same aiohttp
session (keep-alive) sends, in turn: the call straight to the model; the same call through a
bare relay (`bare_relay`: one HTTP hop through Python, checking nothing: the floor of any
gateway in this process); through the gateway with a sandbox token (the conversation and
sandbox records it is checked against are real records in Redis, written by the stores: no
container is needed for the check); and with the user's gateway key. Non-streaming: time to
the whole answer. Streaming: time to the first event line. Targets: p50 overhead <= 2 ms
(non-streaming), <= 1 ms added to time-to-first-token.

READY (Docker): the default spec (through the gateway) and a copy of it with `llm_gateway:
false` (the key in the start request, as before the gateway), both with warm pools of 2; starts
alternate between them, each from a pool member, timed from the POST to the first start-task GET
(10 ms polling) that shows READY; the conversation (and its sandbox) is deleted after each, and
the next waits for both pools to be full. Target: gateway p50 within 10 % of the direct one.

Results go to stdout; exit 0 also when a target is missed (the last line says so), 1 on error
(bench/common.py: run_main).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import REPO, BenchError, Deployment, Samples, main_of, ms
from controlplane import keys
from controlplane.app import create_app
from controlplane.config import ServiceConfig
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.ids import uuid7_hex
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from tests.support.fake_llm import FakeLLM, reply_text
from tests.support.live_server import free_port

LLM_KEY = "sk-bench-" + secrets.token_hex(8)
MODEL = "fake-model"
USER = "bench-gateway"
TARGET_OVERHEAD_MS = 2.0
TARGET_TTFT_MS = 1.0
TARGET_READY_RATIO = 1.10
BODY = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "List the files and say what they are. " * 5},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "terminal",
                "description": "Run a command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ],
}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def gateway_settings(**overrides: Any) -> dict[str, Any]:
    """The gateway's configuration in both servers of a run."""
    return {
        # Counted as in production (a Redis script per call), never refusing the benchmark.
        "llm_rate_limit_per_minute": 100_000_000,
        "llm_prices": {MODEL: (0.000001, 0.000002)},
        "rate_limit_per_minute": 0,
        **overrides,
    }


async def served(config: ServiceConfig, *, with_sandboxes: bool) -> tuple[web.AppRunner, str]:
    app = create_app(config, with_sandboxes=with_sandboxes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


# -- overhead ----------------------------------------------------------------------------------


async def bare_relay(
    target: str, port: int | None = None
) -> tuple[web.AppRunner, str, aiohttp.ClientSession]:
    """The floor of any gateway written like ours: an aiohttp server with no middleware that
    forwards the request's body to `target` (the scripted model's base URL) over one keep-alive
    client session and relays the answer as it comes (a stream by chunks), checking nothing and
    recording nothing. What it adds to a direct call is one HTTP hop through Python; what the
    gateway adds beyond it is its own work (credentials, Redis, budgets, metering)."""
    upstream = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=None)

    async def relay(request: web.Request) -> web.StreamResponse:
        headers = {"Authorization": request.headers.get("Authorization", "")}
        headers["Content-Type"] = "application/json"
        async with upstream.post(
            f"{target}/chat/completions", data=await request.read(), headers=headers
        ) as answer:
            if answer.content_type != "text/event-stream":
                return web.Response(
                    body=await answer.read(), status=answer.status, content_type="application/json"
                )
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            async for chunk in answer.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_get("/ready", ready)  # bench/gateway_cpu.py waits for it
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    port = port or free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/v1", upstream


async def sandbox_token(app: web.Application) -> tuple[str, Callable[[], Awaitable[None]]]:
    """A RUNNING sandbox record and a conversation in it, written by the real stores (no
    container: the gateway checks the records in Redis, which every replica shares), the token
    the gateway checks against them, and how to remove both."""
    gateway = app[keys.GATEWAY]
    store = SandboxStore(app[keys.REDIS], app[keys.SECRET_BOX])
    sandbox_id = uuid7_hex()
    record = SandboxRecord.starting(sandbox_id, USER, "default").model_copy(
        update={"status": SandboxStatus.RUNNING}
    )
    outcome = await store.create(record, 0, Limits())
    if outcome != "ok":
        raise BenchError(f"sandbox record: {outcome}")
    conversations = ConversationStore(app[keys.REDIS])
    info = AppConversationInfo(
        id=uuid7_hex(), created_by_user_id=USER, sandbox_id=sandbox_id, llm_model=MODEL
    )
    await conversations.create(info)

    async def remove() -> None:
        await conversations.delete(info)
        await store.delete(record)

    return gateway.tokens.issue(sandbox_id, info.id, USER), remove


async def timed_call(http: aiohttp.ClientSession, url: str, key: str, stream: bool) -> float:
    body = {**BODY, "stream": True} if stream else BODY
    headers = {"Authorization": f"Bearer {key}"}
    started = time.perf_counter()
    async with http.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise BenchError(f"{url} answered {resp.status}: {await resp.text()}")
        if stream:
            first = await resp.content.readline()
            elapsed = time.perf_counter() - started
            if not first.startswith(b"data: "):
                raise BenchError(f"{url}: the stream began with {first[:80]!r}")
            await resp.read()
            return elapsed
        await resp.read()
        return time.perf_counter() - started


@dataclass
class Options:
    calls: int
    ready_runs: int
    ready: bool
    json_path: Path | None


class GatewayBench:
    """The run (bench/common.py's Benchmark): the overhead without Docker, then READY from the
    warm pools of a deployment on the engine."""

    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.tmp = tmp
        self.deployment = Deployment(tmp, redis_url, f"acs-bench-gw-{secrets.token_hex(4)}-")
        self.samples = Samples()
        self.notes: list[str] = []

    async def measure(self) -> tuple[list[str], list[str]]:
        try:
            if self.options.ready:
                self.deployment.preflight()
                print(self.deployment.environment(), flush=True)
            await self.overhead()
            if self.options.ready:
                await self.ready_runs()
            return report(self.samples)
        finally:
            await self.deployment.redis.aclose()

    def results(self) -> Any:
        return self.samples.values

    def remove_everything(self) -> int:
        return self.deployment.remove_everything() if self.options.ready else 0

    def close(self) -> None:
        self.deployment.close()

    async def overhead(self) -> None:
        fake = FakeLLM(when_exhausted=reply_text("ok"), model=MODEL, api_key=LLM_KEY)
        await fake.start()
        config = self.deployment.config(**gateway_settings(sandbox_host_ports=[fake.port]))
        runner, url = await served(config, with_sandboxes=False)
        floor_runner, floor_url, floor_session = await bare_relay(fake.base_url)
        calls = self.options.calls
        try:
            app = runner.app
            assert isinstance(app, web.Application)
            headers = {"X-Session-API-Key": await self.deployment.user_key(USER)}
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                settings = {
                    "llm_model": MODEL,
                    "llm_base_url": fake.base_url,
                    "llm_api_key": LLM_KEY,
                }
                async with http.post(f"{url}/api/settings", json=settings, headers=headers) as r:
                    if r.status != 200:
                        raise BenchError(f"settings: {r.status} {await r.text()}")
                async with http.get(f"{url}/api/keys/llm/byor", headers=headers) as r:
                    user_key = (await r.json())["key"]
                token, remove_records = await sandbox_token(app)
                direct = f"{fake.base_url}/chat/completions"
                gateway = f"{url}/api/v1/llm-gateway/v1/chat/completions"
                kinds: list[tuple[str, str, str, bool]] = [
                    ("direct", direct, LLM_KEY, False),
                    ("floor", f"{floor_url}/chat/completions", LLM_KEY, False),
                    ("gateway.sandbox", gateway, token, False),
                    ("gateway.user", gateway, user_key, False),
                    ("direct.ttft", direct, LLM_KEY, True),
                    ("floor.ttft", f"{floor_url}/chat/completions", LLM_KEY, True),
                    ("gateway.ttft", gateway, token, True),
                ]
                for _ in range(max(20, calls // 10)):  # warm-up: connections, caches
                    for _name, target, key, stream in kinds:
                        await timed_call(http, target, key, stream)
                log(f"overhead: {calls} calls of each kind, interleaved")
                for i in range(calls):
                    order = kinds if i % 2 == 0 else list(reversed(kinds))
                    for name, target, key, stream in order:
                        cpu = time.process_time()
                        self.samples.add(name, await timed_call(http, target, key, stream))
                        self.samples.add(f"cpu.{name}", time.process_time() - cpu)
                await remove_records()
        finally:
            await runner.cleanup()
            await floor_runner.cleanup()
            await floor_session.close()
            await fake.close()

    async def ready_runs(self) -> None:
        config = self.deployment.config(
            **gateway_settings(
                spec_dir=spec_dir(self.tmp),
                warm_pool=f"default=2,{DIRECT_SPEC_ID}=2",
                pool_interval=0.2,
            )
        )
        runner, url = await served(config, with_sandboxes=True)
        try:
            user = {"X-Session-API-Key": await self.deployment.user_key(f"{USER}-ready")}
            admin = {"X-Session-API-Key": self.deployment.bootstrap_key}
            async with aiohttp.ClientSession(base_url=url) as http:

                async def call(
                    method: str, path: str, headers: dict[str, str], body: Any = None
                ) -> Any:
                    async with http.request(method, path, json=body, headers=headers) as resp:
                        answer = await resp.json(content_type=None)
                        if resp.status >= 300:
                            raise BenchError(f"{method} {path}: {resp.status} {answer}")
                        return answer

                await call(
                    "POST",
                    "/api/settings",
                    user,
                    {
                        "llm_model": MODEL,
                        "llm_base_url": "http://127.0.0.1:9/v1",
                        "llm_api_key": LLM_KEY,
                    },
                )

                async def pools_full() -> bool:
                    view = await call("GET", "/api/v1/sandbox-pool", admin)
                    return all(
                        sum(1 for m in p["members"] if m["ready"] and not m["stale"]) >= 2
                        for p in view["specs"]
                    )

                runs = self.options.ready_runs
                log(f"READY: {runs} pool starts per spec, alternating (first fill takes a while)")
                for i in range(runs + 1):  # the first pair is a warm-up
                    order = ["default", DIRECT_SPEC_ID]
                    if i % 2:
                        order.reverse()
                    for spec in order:
                        await until(pools_full, 180, "both warm pools full")
                        await asyncio.sleep(0.3)  # let the refiller's pass settle
                        elapsed, cid = await self.ready_once(call, user, spec)
                        if i > 0:
                            self.samples.add(f"ready.{spec}", elapsed)
                        await call("DELETE", f"/api/v1/app-conversations/{cid}", user)
        finally:
            await runner.cleanup()

    @staticmethod
    async def ready_once(
        call: Callable[..., Awaitable[Any]], user: dict[str, str], spec: str
    ) -> tuple[float, str]:
        """One start from the pool, POST to the first start-task GET showing READY."""
        started = time.perf_counter()
        task = await call("POST", "/api/v1/app-conversations", user, {"sandbox_spec_id": spec})
        while True:
            (task,) = await call(
                "GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}", user
            )
            if task["status"] in ("READY", "ERROR"):
                break
            await asyncio.sleep(0.010)
        elapsed = time.perf_counter() - started
        if task["status"] != "READY":
            raise BenchError(f"start on {spec}: {task['detail']}")
        return elapsed, str(task["app_conversation_id"])


# -- READY from the warm pool ------------------------------------------------------------------

DIRECT_SPEC_ID = "direct"


def spec_dir(tmp: Path) -> Path:
    target = tmp / "specs"
    target.mkdir(parents=True)
    default = (REPO / "specs" / "default.yaml").read_text()
    (target / "default.yaml").write_text(default)
    direct = default.replace("id: default", f"id: {DIRECT_SPEC_ID}").replace(
        "default: true", "default: false\nllm_gateway: false"
    )
    (target / f"{DIRECT_SPEC_ID}.yaml").write_text(direct)
    return target


async def until(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} not within {within:g} s")
        await asyncio.sleep(0.05)


# -- report ------------------------------------------------------------------------------------


def report(samples: Samples) -> tuple[list[str], list[str]]:
    """The table and the targets missed."""
    lines: list[str] = []
    missed: list[str] = []
    p = samples.p

    def col(seconds: float) -> str:
        return f"{ms(seconds):>8}"

    if "direct" in samples.values:
        lines.append(
            f"{'call':38} {'p50 ms':>8} {'p90 ms':>8} {'added p50':>10} {'ratio':>7} target"
        )
        for name, base, floor, target in (
            ("gateway.sandbox", "direct", "floor", TARGET_OVERHEAD_MS),
            ("gateway.user", "direct", "floor", TARGET_OVERHEAD_MS),
            ("gateway.ttft", "direct.ttft", "floor.ttft", TARGET_TTFT_MS),
        ):
            added = (p(name, 50) - p(base, 50)) * 1000
            ok = added <= target
            if not ok:
                missed.append(f"{name}: +{added:.2f} ms > {target} ms")
            label = {
                "gateway.sandbox": "non-streaming, sandbox token",
                "gateway.user": "non-streaming, user gateway key",
                "gateway.ttft": "streaming, time to first event",
            }[name]
            lines.append(f"{'  direct: ' + base:38} {col(p(base, 50))} {col(p(base, 90))}")
            if floor in samples.values:
                hop = (p(floor, 50) - p(base, 50)) * 1000
                lines.append(
                    f"{'  floor: bare relay, checks nothing':38} {col(p(floor, 50))} "
                    f"{col(p(floor, 90))} {hop:9.2f}  {p(floor, 50) / p(base, 50):6.2f}"
                )
            lines.append(
                f"{'  gateway: ' + label:38} {col(p(name, 50))} {col(p(name, 90))} "
                f"{added:9.2f}  {p(name, 50) / p(base, 50):6.2f}  <= {target} ms "
                f"{'ok' if ok else 'MISSED'}"
            )
    if "cpu.direct" in samples.values:
        lines.append("")
        lines.append("CPU of this process per call (client, model and control plane share it; the")
        lines.append("difference is the gateway's own work, which load does not inflate):")
        for name, base in (
            ("floor", "direct"),
            ("gateway.sandbox", "direct"),
            ("gateway.user", "direct"),
            ("floor.ttft", "direct.ttft"),
            ("gateway.ttft", "direct.ttft"),
        ):
            if f"cpu.{name}" not in samples.values:
                continue
            added = (p(f"cpu.{name}", 50) - p(f"cpu.{base}", 50)) * 1000
            lines.append(
                f"  {name:36} {col(p(f'cpu.{name}', 50))} vs {col(p(f'cpu.{base}', 50))}"
                f"   added {added:.2f} ms"
            )
    if "ready.default" in samples.values:
        gw, direct = p("ready.default", 50), p(f"ready.{DIRECT_SPEC_ID}", 50)
        ratio = gw / direct
        ok = ratio <= TARGET_READY_RATIO
        if not ok:
            missed.append(f"READY ratio {ratio:.3f} > {TARGET_READY_RATIO}")
        lines.append("")
        lines.append(f"{'conversation READY from the pool':38} {'p50 ms':>8} {'p90 ms':>8}")
        lines.append(
            f"{'  key in the sandbox (llm_gateway off)':38} {col(direct)} "
            f"{col(p(f'ready.{DIRECT_SPEC_ID}', 90))}"
        )
        lines.append(
            f"{'  through the gateway (default)':38} {col(gw)} {col(p('ready.default', 90))}"
            f"   ratio {ratio:.3f}  <= {TARGET_READY_RATIO} {'ok' if ok else 'MISSED'}"
        )
    return lines, missed


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--ready-runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="100 calls, 4 READY runs per spec")
    parser.add_argument("--no-ready", dest="ready", action="store_false")
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.ready_runs = 100, 4
    return Options(args.calls, args.ready_runs, args.ready, args.json)


main = main_of(parse_args, GatewayBench, "acs-bench-gw-")

if __name__ == "__main__":
    sys.exit(main(None))
