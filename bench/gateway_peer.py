"""The LLM gateway beside LiteLLM's proxy (issue 30, item 3): both in front of the same scripted
model in one run, at the same concurrencies, streamed and not; what each adds to a direct call
(p50/p95/p99 of time to the first token and to the last), the ratio, and the calls a second.

    .venv/bin/python -m bench.gateway_peer                     # 1, 16, 64 concurrent; 400 calls
    .venv/bin/python -m bench.gateway_peer --calls 100 --concurrency 1,16

Every server runs in a process of its own, the client in this one:
- the scripted model, tests/support/fake_llm.py (`--fake-llm PORT`: this file, as a child);
- LiteLLM's proxy (`litellm --config`, one worker, a master key, no database: its lightest
  set-up), installed with `pip install 'litellm[proxy]'` into a venv of its own under
  $ACS_CACHE_DIR/bench/litellm-venv (~/.cache/acs), never into the project's; with
  `--litellm-db`, as a team runs it: its database on a private PostgreSQL, prices set, called
  with a virtual key with a budget made through its `/key/generate` (bench/litellm_db.py);
- ours: `controlplane serve` on a private redis-server, called with the user's gateway key
  (`GET /api/keys/llm/byor`), prices and the per-user model rate limit on (counted in Redis on
  every call, never refusing the bench).
Each concurrency level runs its calls in rounds, the three targets in turn (the order reversed
every round), so host noise reaches all three. bench/README.md says what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import litellm_db
from bench.burst import Server, stop_server
from bench.common import (
    BenchError,
    Deployment,
    Samples,
    concurrency_levels,
    main_of,
    percentile,
    process_cpu,
)
from tests.support.fake_llm import FakeLLM, reply_text
from tests.support.live_server import free_port

MODEL = "fake-model"
LLM_KEY = "sk-bench-" + secrets.token_hex(8)
MASTER_KEY = "sk-litellm-" + secrets.token_hex(8)
USER = "bench-peer"
PRICES = (0.000001, 0.000002)  # $ a prompt token, a completion token: both gateways meter them
KEY_BUDGET = 1000.0  # the virtual key's budget ($): ~7 million of the bench's calls
TARGET_ADDED_RATIO = 0.15
TARGET_THROUGHPUT_RATIO = 10.0
CACHE = Path(os.environ.get("ACS_CACHE_DIR", Path.home() / ".cache" / "acs")) / "bench"
LITELLM_SPEC = "litellm[proxy]"
BODY = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "List the files and say what they are. " * 5},
    ],
}
TARGETS = ("direct", "litellm", "ours")
QS = (50, 95, 99)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Options:
    calls: int
    concurrency: list[int]
    rounds: int
    json_path: Path | None
    translated: bool = False
    litellm_db: bool = False


def litellm_binary() -> Path:
    """LiteLLM's proxy in a venv of its own (made on first use: a few minutes)."""
    venv = CACHE / "litellm-venv"
    binary = venv / "bin" / "litellm"
    if binary.exists():
        return binary
    log(f"installing {LITELLM_SPEC} into {venv} (once)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", LITELLM_SPEC]
    if subprocess.run(pip, check=False).returncode != 0 or not binary.exists():
        raise BenchError(f"could not install {LITELLM_SPEC} into {venv}")
    return binary


def litellm_version(binary: Path) -> str:
    out = subprocess.run(
        [str(binary.parent / "python"), "-c", "import importlib.metadata as m;"
         "print(m.version('litellm'))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "?"


class Child:
    """A server in a process of its own, ready when `url` + `probe` answers."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self, http: aiohttp.ClientSession, probe: str, headers: dict[str, str],
                    timeout: float = 180.0) -> None:  # fmt: skip
        self.spawn()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(probe, headers=headers) as resp:
                    if resp.status == 200:
                        return
            if self.process.poll() is not None:
                raise BenchError(f"{self.name} exited; see {self.log_path}")
            await asyncio.sleep(0.3)
        raise BenchError(f"{self.name} did not answer in {timeout:g} s; see {self.log_path}")

    def spawn(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )

    def cpu(self) -> float:
        assert self.process is not None
        return process_cpu(self.process.pid)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Refused(Exception):
    """A call answered other than 200: its status and body, kept for the table."""

    def __init__(self, status: int, body: str, after: float) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body
        self.after = after


async def one_call(
    http: aiohttp.ClientSession, url: str, key: str, stream: bool
) -> tuple[float, float]:
    """(time to the first token, time to the last): the first `data:` line of a stream, or the
    whole answer without one (both the same then). Refused for an answer other than 200."""
    body = {**BODY, "stream": True} if stream else BODY
    started = time.perf_counter()
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        if resp.status != 200:
            text = (await resp.text())[:300]
            raise Refused(resp.status, text, time.perf_counter() - started)
        if not stream:
            await resp.read()
            total = time.perf_counter() - started
            return total, total
        first = None
        async for line in resp.content:
            if first is None and line.startswith(b"data: "):
                first = time.perf_counter() - started
        total = time.perf_counter() - started
        if first is None:
            raise BenchError(f"{url}: a stream without a data line")
        return first, total


class PeerBench:
    def __init__(self, opt: Options, tmp: Path, redis_url: str) -> None:
        self.opt = opt
        self.tmp = tmp
        self.deploy = Deployment(tmp, redis_url, f"acs-bench-peer-{secrets.token_hex(3)}-")
        self.samples = Samples()
        self.notes: list[str] = []
        self.children: list[Child] = []
        self.urls: dict[str, tuple[str, str]] = {}  # target -> (chat completions URL, key)
        self.rates: dict[str, float] = {}  # "<target>.<mode>.c<n>" -> calls a second
        self.cpu: dict[str, float] = {}  # the same -> server CPU seconds a call
        self.refusals: dict[str, list[Refused]] = {}  # the same -> its answers other than 200
        self.env_line = ""
        self.ours: Server | None = None
        self.postgres: litellm_db.Postgres | None = None
        self.engine_pid: int | None = None
        self.db_cpu: dict[str, float] = {}  # "litellm.<mode>.c<n>" -> engine + PostgreSQL s/call
        self.db_queries: dict[str, float] = {}  # the same -> the engine's queries a call

    def remove_everything(self) -> int:
        for child in self.children:
            child.stop()
        litellm_db.stop_engine(self.engine_pid)
        if self.postgres is not None:
            self.postgres.stop()
        if self.ours is not None:
            stop_server(self.ours)
        return 0

    def close(self) -> None:
        self.deploy.close()

    def results(self) -> Any:
        refusals = {
            name: [{"status": r.status, "body": r.body, "after": r.after} for r in refused]
            for name, refused in self.refusals.items()
        }
        return {
            "samples": self.samples.values,
            "rates": self.rates,
            "cpu": self.cpu,
            "db_cpu": self.db_cpu,
            "db_queries": self.db_queries,
            "refusals": refusals,
        }

    async def servers(self, http: aiohttp.ClientSession) -> None:
        binary = litellm_binary()
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("ACS_", "LITELLM"))}
        fake_port = free_port()
        fake = Child(
            "the scripted model",
            [sys.executable, "-m", "bench.gateway_peer", "--fake-llm", str(fake_port), LLM_KEY],
            base_env,
            self.tmp / "fake.log",
        )
        self.children.append(fake)
        base = f"http://127.0.0.1:{fake_port}/v1"
        await fake.start(http, f"{base}/models", {"Authorization": f"Bearer {LLM_KEY}"})
        self.urls["direct"] = (f"{base}/chat/completions", LLM_KEY)

        config = self.tmp / "litellm.yaml"
        prices = (
            f"      input_cost_per_token: {PRICES[0]}\n      output_cost_per_token: {PRICES[1]}\n"
            if self.opt.litellm_db
            else ""
        )
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {base}\n"
            f"      api_key: {LLM_KEY}\n"
            f"{prices}"
            "general_settings:\n"
            f"  master_key: {MASTER_KEY}\n"
            "litellm_settings:\n"
            "  drop_params: true\n"
        )
        db_env = self.database(binary) if self.opt.litellm_db else {}
        port = free_port()
        litellm = Child(
            "LiteLLM's proxy",
            [
                str(binary),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            {**base_env, "LITELLM_LOG": "ERROR", **db_env},
            self.tmp / "litellm.log",
        )
        self.children.append(litellm)
        await litellm.start(
            http,
            f"http://127.0.0.1:{port}/health/liveliness",
            {"Authorization": f"Bearer {MASTER_KEY}"},
        )
        litellm_key = MASTER_KEY
        if self.opt.litellm_db:
            assert litellm.process is not None
            self.engine_pid = litellm_db.engine_process(litellm.process.pid)
            if self.engine_pid is None:
                raise BenchError(f"LiteLLM's proxy started no query engine; see {litellm.log_path}")
            litellm_key = await self.virtual_key(http, f"http://127.0.0.1:{port}")
        self.urls["litellm"] = (f"http://127.0.0.1:{port}/v1/chat/completions", litellm_key)

        ours = Server(
            self.deploy,
            self.tmp,
            {
                "ACS_SANDBOX_HOST_PORTS": str(fake_port),
                "ACS_LLM_PRICES": f'{{"{MODEL}": [0.000001, 0.000002]}}',
                "ACS_LLM_RATE_LIMIT_PER_MINUTE": "100000000",
                "ACS_WARM_POOL": "0",
                # --translated: every call through the LiteLLM translator (translator.py).
                **({"ACS_LLM_GATEWAY_DIRECT": "false"} if self.opt.translated else {}),
            },
        )
        self.ours = ours
        await ours.start(http)
        headers = {"X-Session-API-Key": await self.deploy.user_key(USER)}
        settings = {"llm_model": MODEL, "llm_base_url": base, "llm_api_key": LLM_KEY}
        async with http.post(f"{ours.url}/api/settings", json=settings, headers=headers) as r:
            if r.status != 200:
                raise BenchError(f"settings: {r.status} {await r.text()}")
        async with http.get(f"{ours.url}/api/keys/llm/byor", headers=headers) as r:
            user_key = (await r.json())["key"]
        self.urls["ours"] = (f"{ours.url}/api/v1/llm-gateway/v1/chat/completions", user_key)
        self.litellm = litellm
        setup = "master key, no database"
        if self.postgres is not None:
            setup = (
                f"a virtual key with a ${KEY_BUDGET:g} budget, prices, PostgreSQL "
                f"{self.postgres.version()} through Prisma 5.17's query engine (Wasm build)"
            )
        self.env_line = (
            f"env: {os.cpu_count()} cores | LiteLLM {litellm_version(binary)} (proxy, 1 worker, "
            f"{setup}) | Python {sys.version.split()[0]} | load avg {os.getloadavg()[0]:.2f}"
        )
        if self.opt.translated:
            self.env_line += (
                " | ours: every call through its LiteLLM translator (a child process whose CPU "
                "the server CPU column leaves out)"
            )

    def database(self, binary: Path) -> dict[str, str]:
        """--litellm-db: PostgreSQL started, LiteLLM's schema in it, its Prisma client made; the
        environment its proxy runs in."""
        venv = binary.parent.parent
        modules = litellm_db.ensure_toolchain(venv, CACHE)
        env = litellm_db.engine_env(venv, modules)
        litellm_db.generate_client(venv, env, self.tmp)
        self.postgres = litellm_db.Postgres(self.tmp)
        self.postgres.start()
        applied = litellm_db.apply_migrations(venv, self.postgres)
        log(f"PostgreSQL {self.postgres.version()} on port {self.postgres.port}: "
            f"{applied} LiteLLM migrations applied")  # fmt: skip
        # The migrations are applied above; the proxy's own `prisma migrate deploy` would need
        # Prisma's schema engine, which is not to be had here (bench/README.md).
        return {**env, "DATABASE_URL": self.postgres.url, "DISABLE_SCHEMA_UPDATE": "true"}

    async def virtual_key(self, http: aiohttp.ClientSession, url: str) -> str:
        """A virtual key for the model with a budget, made as a team makes one."""
        body = {"models": [MODEL], "max_budget": KEY_BUDGET, "key_alias": "acs-bench"}
        headers = {"Authorization": f"Bearer {MASTER_KEY}"}
        async with http.post(f"{url}/key/generate", json=body, headers=headers) as resp:
            if resp.status != 200:
                raise BenchError(f"LiteLLM /key/generate: {resp.status} {await resp.text()}")
            key: str = (await resp.json())["key"]
        return key

    async def key_spend(self) -> None:
        """What LiteLLM's database recorded for the virtual key: its spend (written in batches,
        so waited for up to 30 s) and its spend logs, as a note under the table."""
        if self.postgres is None:
            return
        query = (
            'SELECT (SELECT spend FROM "LiteLLM_VerificationToken" WHERE key_alias = '
            "'acs-bench'), (SELECT count(*) FROM \"LiteLLM_SpendLogs\")"
        )
        spend, rows = "0", "0"
        for _ in range(30):
            spend, rows = self.postgres.psql("-At", "-F", " ", "-c", query, what="spend").split()
            if float(spend) > 0:
                break
            await asyncio.sleep(1)
        self.notes.append(
            f"LiteLLM's database: the virtual key's spend ${float(spend):.4f} of its "
            f"${KEY_BUDGET:g} budget, {rows} spend log rows"
        )

    def db_side(self) -> tuple[float, int] | None:
        """(engine + PostgreSQL CPU seconds, the engine's queries) so far, with --litellm-db."""
        if self.postgres is None or self.engine_pid is None:
            return None
        stats = litellm_db.engine_stats(self.engine_pid)
        return process_cpu(self.engine_pid) + self.postgres.cpu(), stats["queries"]

    def server_cpu(self, target: str) -> float | None:
        if target == "ours" and self.ours is not None:
            return self.ours.cpu()
        if target == "litellm":
            return self.litellm.cpu()
        return None

    async def level(
        self, http: aiohttp.ClientSession, target: str, stream: bool, conc: int, calls: int
    ) -> tuple[float, int]:
        """`calls` calls, `conc` at a time; (wall seconds, calls made)."""
        url, key = self.urls[target]
        name = f"{target}.{'stream' if stream else 'plain'}.c{conc}"
        left = calls

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t = time.perf_counter()
                try:
                    first, total = await one_call(http, url, key, stream)
                except Refused as refused:
                    self.refusals.setdefault(name, []).append(refused)
                    continue
                except (aiohttp.ClientError, OSError) as exc:  # status 0: no HTTP answer
                    lost = Refused(0, f"{type(exc).__name__}: {exc}", time.perf_counter() - t)
                    self.refusals.setdefault(name, []).append(lost)
                    continue
                self.samples.add(f"{name}.first", first)
                self.samples.add(f"{name}.last", total)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return time.perf_counter() - t0, calls

    async def measure(self) -> tuple[list[str], list[str]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            try:
                await self.servers(http)
                log(self.env_line)
                for target in TARGETS:  # warm-up: connections, caches, LiteLLM's first call
                    for stream in (False, True):
                        await self.level(http, target, stream, 4, 20)
                self.samples = Samples()
                for conc in self.opt.concurrency:
                    await self.run_level(http, conc)
                await self.key_spend()
            finally:
                self.remove_everything()
        return self.table()

    async def run_level(self, http: aiohttp.ClientSession, conc: int) -> None:
        per_round = max(conc, self.opt.calls // self.opt.rounds)
        log(f"concurrency {conc}: {self.opt.rounds} rounds of {per_round} calls a target")
        walls: dict[str, float] = {}
        counts: dict[str, int] = {}
        cpus: dict[str, float] = {}
        db: dict[str, tuple[float, int]] = {}
        for r in range(self.opt.rounds):
            order = TARGETS if r % 2 == 0 else tuple(reversed(TARGETS))
            for stream in (False, True):
                for target in order:
                    name = f"{target}.{'stream' if stream else 'plain'}.c{conc}"
                    cpu0 = self.server_cpu(target)
                    db0 = self.db_side() if target == "litellm" else None
                    wall, n = await self.level(http, target, stream, conc, per_round)
                    cpu1 = self.server_cpu(target)
                    db1 = self.db_side() if target == "litellm" else None
                    walls[name] = walls.get(name, 0.0) + wall
                    counts[name] = counts.get(name, 0) + n
                    if cpu0 is not None and cpu1 is not None:
                        cpus[name] = cpus.get(name, 0.0) + cpu1 - cpu0
                    if db0 is not None and db1 is not None:
                        seen = db.get(name, (0.0, 0))
                        db[name] = (seen[0] + db1[0] - db0[0], seen[1] + db1[1] - db0[1])
        for name, wall in walls.items():
            self.rates[name] = counts[name] / wall
            if name in cpus:
                self.cpu[name] = cpus[name] / counts[name]
            if name in db:
                self.db_cpu[name] = db[name][0] / counts[name]
                self.db_queries[name] = db[name][1] / counts[name]
        self.notes.append(f"load avg after concurrency {conc}: {os.getloadavg()[0]:.1f}")

    def table(self) -> tuple[list[str], list[str]]:
        lines = [
            self.env_line,
            "added = target's percentile - the direct call's at the same concurrency and mode; "
            "plain: time to the whole answer; stream: to the first `data:` line (ttft) and to "
            "the last",
            "conc | mode   | what   | direct p50/p95/p99 ms | LiteLLM added p50/p95/p99 | "
            "ours added p50/p95/p99 | ours/LiteLLM added p50, p99 | calls/s direct, LiteLLM, "
            "ours | server CPU ms/call LiteLLM, ours"
            + (
                " | LiteLLM's database CPU ms/call (engine + PostgreSQL), queries/call"
                if self.opt.litellm_db
                else ""
            ),
        ]
        missed: list[str] = []
        for conc in self.opt.concurrency:
            for mode, what in (("plain", "last"), ("stream", "first"), ("stream", "last")):
                key = f"{mode}.c{conc}.{what}"
                direct = [self.p(f"direct.{key}", q) for q in QS]
                lite = [self.p(f"litellm.{key}", q) - d for q, d in zip(QS, direct, strict=True)]
                ours = [self.p(f"ours.{key}", q) - d for q, d in zip(QS, direct, strict=True)]
                r50 = ours[0] / lite[0] if lite[0] > 0 else float("nan")
                r99 = ours[2] / lite[2] if lite[2] > 0 else float("nan")
                rates = [self.rates.get(f"{t}.{mode}.c{conc}", 0.0) for t in TARGETS]
                cpu = [self.cpu.get(f"{t}.{mode}.c{conc}") for t in ("litellm", "ours")]
                cpu_text = ", ".join(f"{c * 1000:.1f}" if c is not None else "-" for c in cpu)
                db_cpu = self.db_cpu.get(f"litellm.{mode}.c{conc}")
                if db_cpu is not None and what != "first":
                    queries = self.db_queries.get(f"litellm.{mode}.c{conc}", 0.0)
                    cpu_text += f" | {db_cpu * 1000:.2f}, {queries:.3f}"
                lines.append(
                    f"{conc:>4} | {mode:<6} | {'ttft' if what == 'first' else 'last':<6} | "
                    f"{self.f3(direct):>21} | {self.f3(lite, '+'):>25} | "
                    f"{self.f3(ours, '+'):>22} | "
                    f"{r50:.2f}x, {r99:.2f}x{'':>14} | {rates[0]:,.0f}, {rates[1]:,.0f}, "
                    f"{rates[2]:,.0f} | {cpu_text}"
                )
                if what != "first" and r50 > TARGET_ADDED_RATIO:
                    missed.append(f"c{conc} {mode}: ours adds {r50:.2f}x LiteLLM's p50")
            plain = [self.rates.get(f"{t}.plain.c{conc}", 0.0) for t in TARGETS]
            if conc == max(self.opt.concurrency) and plain[1] > 0:
                ratio = plain[2] / plain[1]
                mark = "ok" if ratio >= TARGET_THROUGHPUT_RATIO else "MISSED"
                lines.append(
                    f"  throughput at {conc} concurrent (non-streaming): ours {plain[2]:,.0f} "
                    f"calls/s, LiteLLM {plain[1]:,.0f}, direct {plain[0]:,.0f}: ours "
                    f"{ratio:.1f}x LiteLLM's, {mark} (target >= {TARGET_THROUGHPUT_RATIO:g}x)"
                )
                if ratio < TARGET_THROUGHPUT_RATIO:
                    missed.append(f"throughput {ratio:.1f}x LiteLLM's")
        lines.extend(self.refusal_lines(missed))
        return lines, missed

    def refusal_lines(self, missed: list[str]) -> list[str]:
        """Every answer other than 200, by target, mode and level (the warm-up's, at c4, too):
        how many of each status and body, and how long the slowest took to come."""
        if not self.refusals:
            return ["answers other than 200: none"]
        lines = ["answers other than 200 (not in the percentiles above):"]
        for name, refused in sorted(self.refusals.items()):
            kinds: dict[tuple[int, str], int] = {}
            for r in refused:
                kinds[(r.status, r.body)] = kinds.get((r.status, r.body), 0) + 1
            slowest = max(r.after for r in refused) * 1000
            lines.append(f"  {name}: {len(refused)} (the slowest after {slowest:,.0f} ms)")
            lines.extend(f"    {n} x {status} {body}" for (status, body), n in kinds.items())
            if name.startswith("ours."):
                missed.append(f"{name}: {len(refused)} calls answered other than 200")
        return lines

    def p(self, name: str, q: float) -> float:
        values = self.samples.values.get(name, [])
        return percentile(values, q) * 1000 if values else float("nan")

    @staticmethod
    def f3(values: list[float], sign: str = "") -> str:
        return "/".join(f"{sign if v >= 0 else ''}{v:.1f}" for v in values)


async def serve_fake_llm(port: int, key: str) -> None:
    """The scripted model, alone in this process, until it is terminated (it answers 401 to
    any other key than `key`)."""
    fake = FakeLLM(port=port, when_exhausted=reply_text("ok"), model=MODEL, api_key=key)
    await fake.start()
    await asyncio.Event().wait()


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls a target and level (400)")
    parser.add_argument("--concurrency", default="1,16,64", help="levels (1,16,64)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds the calls are split in (4)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument(
        "--translated",
        action="store_true",
        help="ours sends every call through its LiteLLM translator (ACS_LLM_GATEWAY_DIRECT=false)",
    )
    parser.add_argument(
        "--litellm-db",
        action="store_true",
        help="LiteLLM as a team runs it: PostgreSQL, a virtual key with a budget, prices",
    )
    args = parser.parse_args(argv)
    levels = concurrency_levels(parser, args.concurrency, args.calls, args.rounds)
    return Options(
        args.calls, levels, args.rounds, args.json_path, args.translated, args.litellm_db
    )


main = main_of(parse, PeerBench, "acs-peer-")

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--fake-llm":
        asyncio.run(serve_fake_llm(int(sys.argv[2]), sys.argv[3]))
    else:
        sys.exit(main(None))
