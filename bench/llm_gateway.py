"""LLM gateway benchmark: what the gateway adds to a model call, against calling the scripted
model directly in the same run, and whether it changes conversation READY from the warm pool.

    .venv/bin/python bench/llm_gateway.py [--calls N] [--ready-runs N] [--quick] [--no-ready]

Overhead (no Docker): a private redis-server, the real app over real HTTP on 127.0.0.1, and the
scripted OpenAI-compatible model (tests/fake_llm.py) on 127.0.0.1. The same aiohttp session (keep-
alive) sends, in turn: the call straight to the model; the same call through the gateway with a
sandbox token (the conversation and sandbox records it is checked against are real records in
Redis, written by the stores: no container is needed for the check); and with the user's gateway
key. Non-streaming: time to the whole answer. Streaming: time to the first event line.
Targets: p50 overhead <= 2 ms (non-streaming), <= 1 ms added to time-to-first-token.

READY (Docker): the default spec (through the gateway) and a copy of it with `llm_gateway:
false` (the key in the start request, as before the gateway), both with warm pools of 2; starts
alternate between them, each from a pool member, timed from the POST to the first start-task GET
(10 ms polling) that shows READY; the conversation (and its sandbox) is deleted after each, and
the next waits for both pools to be full. Target: gateway p50 within 10 % of the direct one.

Results go to stdout; exit 0 also when a target is missed (the last line says so), 1 on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.fernet import Fernet

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # bench/ and tests/ are not installed packages

from bench.sandboxes import Bench as SandboxBench  # noqa: E402
from bench.sandboxes import BenchError, percentile  # noqa: E402
from bench.sandboxes import Options as SandboxOptions  # noqa: E402
from controlplane import keys  # noqa: E402
from controlplane.app import create_app  # noqa: E402
from controlplane.auth.service import ApiKeyService  # noqa: E402
from controlplane.config import ServiceConfig, load_config  # noqa: E402
from controlplane.conversations.models import AppConversationInfo  # noqa: E402
from controlplane.conversations.store import ConversationStore  # noqa: E402
from controlplane.gateway.keys import GATEWAY  # noqa: E402
from controlplane.ids import uuid7_hex  # noqa: E402
from controlplane.logging import configure_logging  # noqa: E402
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus  # noqa: E402
from controlplane.sandboxes.store import Limits, SandboxStore  # noqa: E402
from tests.fake_llm import FakeLLM, reply_text  # noqa: E402
from tests.live_server import free_port  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

LLM_KEY = "sk-bench-" + secrets.token_hex(8)
MODEL = "fake-model"
USER = "bench-gateway"
SECRET_KEY = Fernet.generate_key().decode()
"""One key for both servers of a run: they share the private Redis."""
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


def base_config(tmp: Path, redis_url: str, **overrides: Any) -> ServiceConfig:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "data_dir": tmp / "data",
        "secret_key": SECRET_KEY,
        "bootstrap_api_key": "bench-bootstrap-" + secrets.token_hex(12),
        "log_level": "warning",
        "rate_limit_per_minute": 0,
        # Counted as in production (a Redis script per call), never refusing the benchmark.
        "llm_rate_limit_per_minute": 100_000_000,
        "llm_prices": {MODEL: (0.000001, 0.000002)},
        "image_tag": os.environ.get("ACS_IMAGE_TAG") or None,
    }
    values.update(overrides)
    return load_config({}, **values)


async def served(config: ServiceConfig, *, with_sandboxes: bool) -> tuple[web.AppRunner, str]:
    app = create_app(config, with_sandboxes=with_sandboxes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


# -- overhead ----------------------------------------------------------------------------------


async def sandbox_token(app: web.Application) -> tuple[str, Callable[[], Awaitable[None]]]:
    """A RUNNING sandbox record and a conversation in it, written by the real stores, the token
    the gateway checks against them, and how to remove both."""
    gateway = app[GATEWAY]
    store = SandboxStore(app[keys.REDIS], app[keys.SECRET_BOX])
    gateway._sandboxes = store  # the app runs without Docker services here
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


async def overhead(calls: int, tmp: Path, redis_url: str) -> dict[str, list[float]]:
    fake = FakeLLM(when_exhausted=reply_text("ok"), model=MODEL, api_key=LLM_KEY)
    await fake.start()
    config = base_config(tmp, redis_url, sandbox_host_ports=[fake.port])
    runner, url = await served(config, with_sandboxes=False)
    samples: dict[str, list[float]] = {}
    try:
        app = runner.app
        assert isinstance(app, web.Application)
        created = await ApiKeyService(app[keys.REDIS], None).create(USER)
        record_key = created.key
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            headers = {"X-Session-API-Key": record_key}
            settings = {"llm_model": MODEL, "llm_base_url": fake.base_url, "llm_api_key": LLM_KEY}
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
                ("gateway.sandbox", gateway, token, False),
                ("gateway.user", gateway, user_key, False),
                ("direct.ttft", direct, LLM_KEY, True),
                ("gateway.ttft", gateway, token, True),
            ]
            for _ in range(max(20, calls // 10)):  # warm-up: connections, caches, JIT-less paths
                for _name, target, key, stream in kinds:
                    await timed_call(http, target, key, stream)
            log(f"overhead: {calls} calls of each kind, interleaved")
            for i in range(calls):
                order = kinds if i % 2 == 0 else list(reversed(kinds))
                for name, target, key, stream in order:
                    cpu = time.process_time()
                    samples.setdefault(name, []).append(await timed_call(http, target, key, stream))
                    samples.setdefault(f"cpu.{name}", []).append(time.process_time() - cpu)
            await remove_records()
    finally:
        await runner.cleanup()
        await fake.close()
    return samples


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


async def ready_runs(runs: int, tmp: Path, redis_url: str) -> dict[str, list[float]]:
    raw = SandboxBench(
        SandboxOptions(runs=0, warmup=0, settle=0.0, search_requests=0, json_path=None),
        tmp,
        redis_url,
    )
    prefix = f"acs-bench-gw-{secrets.token_hex(4)}-"
    raw.prefix = prefix
    config = base_config(
        tmp,
        redis_url,
        container_prefix=prefix,
        spec_dir=spec_dir(tmp),
        warm_pool=f"default=2,{DIRECT_SPEC_ID}=2",
        pool_interval=0.2,
    )
    samples: dict[str, list[float]] = {}
    runner, url = await served(config, with_sandboxes=True)
    try:
        app = runner.app
        assert isinstance(app, web.Application)
        # A user of its own: this server's secret key is not the overhead server's.
        created = await ApiKeyService(app[keys.REDIS], None).create(f"{USER}-ready")
        user = {"X-Session-API-Key": created.key}
        admin = {"X-Session-API-Key": config.bootstrap_api_key or ""}
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

            log(f"READY: {runs} pool starts per spec, alternating (first fill takes a while)")
            for i in range(runs + 1):  # the first pair is a warm-up
                order = ["default", DIRECT_SPEC_ID]
                if i % 2:
                    order.reverse()
                for spec in order:
                    await until(pools_full, 180, "both warm pools full")
                    await asyncio.sleep(0.3)  # let the refiller's pass settle
                    started = time.perf_counter()
                    task = await call(
                        "POST", "/api/v1/app-conversations", user, {"sandbox_spec_id": spec}
                    )
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
                    if i > 0:
                        samples.setdefault(f"ready.{spec}", []).append(elapsed)
                    cid = task["app_conversation_id"]
                    await call("DELETE", f"/api/v1/app-conversations/{cid}", user)
    finally:
        await runner.cleanup()
        await asyncio.to_thread(raw.remove_everything)
    return samples


# -- report ------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


def report(samples: dict[str, list[float]]) -> list[str]:
    lines: list[str] = []
    missed: list[str] = []

    def p(name: str, q: float) -> float:
        return percentile(samples.get(name, []), q)

    if "direct" in samples:
        lines.append(
            f"{'call':38} {'p50 ms':>8} {'p90 ms':>8} {'added p50':>10} {'ratio':>7} target"
        )
        for name, base, target in (
            ("gateway.sandbox", "direct", TARGET_OVERHEAD_MS),
            ("gateway.user", "direct", TARGET_OVERHEAD_MS),
            ("gateway.ttft", "direct.ttft", TARGET_TTFT_MS),
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
            lines.append(f"{'  direct: ' + base:38} {ms(p(base, 50))} {ms(p(base, 90))}")
            lines.append(
                f"{'  gateway: ' + label:38} {ms(p(name, 50))} {ms(p(name, 90))} "
                f"{added:9.2f}  {p(name, 50) / p(base, 50):6.2f}  <= {target} ms "
                f"{'ok' if ok else 'MISSED'}"
            )
    if "cpu.direct" in samples:
        lines.append("")
        lines.append("CPU of this process per call (client, model and control plane share it; the")
        lines.append("difference is the gateway's own work, which load does not inflate):")
        for name, base in (
            ("gateway.sandbox", "direct"),
            ("gateway.user", "direct"),
            ("gateway.ttft", "direct.ttft"),
        ):
            added = (p(f"cpu.{name}", 50) - p(f"cpu.{base}", 50)) * 1000
            lines.append(
                f"  {name:36} {ms(p(f'cpu.{name}', 50))} vs {ms(p(f'cpu.{base}', 50))}"
                f"   added {added:.2f} ms"
            )
    if "ready.default" in samples:
        gw, direct = p("ready.default", 50), p(f"ready.{DIRECT_SPEC_ID}", 50)
        ratio = gw / direct
        ok = ratio <= TARGET_READY_RATIO
        if not ok:
            missed.append(f"READY ratio {ratio:.3f} > {TARGET_READY_RATIO}")
        lines.append("")
        lines.append(f"{'conversation READY from the pool':38} {'p50 ms':>8} {'p90 ms':>8}")
        lines.append(
            f"{'  key in the sandbox (llm_gateway off)':38} {ms(direct)} "
            f"{ms(p(f'ready.{DIRECT_SPEC_ID}', 90))}"
        )
        lines.append(
            f"{'  through the gateway (default)':38} {ms(gw)} {ms(p('ready.default', 90))}"
            f"   ratio {ratio:.3f}  <= {TARGET_READY_RATIO} {'ok' if ok else 'MISSED'}"
        )
    lines.append("")
    lines.append("targets: all met" if not missed else "targets MISSED: " + "; ".join(missed))
    return lines


async def main_async(options: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="acs-bench-gw-") as raw_tmp:
        tmp = Path(raw_tmp)
        redis = RedisServer(tmp / "redis")
        (tmp / "redis").mkdir()
        redis.start()
        try:
            samples = await overhead(options.calls, tmp / "o", redis.url)
            if options.ready:
                samples |= await ready_runs(options.ready_runs, tmp / "r", redis.url)
        finally:
            redis.stop()
    print("\n".join(report(samples)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--ready-runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="100 calls, 4 READY runs per spec")
    parser.add_argument("--no-ready", dest="ready", action="store_false")
    options = parser.parse_args(argv)
    if options.quick:
        options.calls, options.ready_runs = 100, 4
    configure_logging("console", "warning", sys.stderr)
    try:
        return asyncio.run(main_async(options))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
