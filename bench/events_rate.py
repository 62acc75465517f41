"""Events at rate (issue 30, item 2): C running conversations whose agents post events at R/s
each through the real webhook route with the sandbox's session key, S WebSocket subscribers and
P clients paging events/search; delivery latency to every subscriber, none lost, duplicated or
out of order, throughput, the control plane's CPU per 1,000 events and its memory; beside the
raw Redis operation (XADD, and S readers blocked in XREAD) at the same rate in the same run.

    .venv/bin/python -m bench.events_rate                      # 200 x 50/s, 500 sockets, 50 pagers
    .venv/bin/python -m bench.events_rate --conversations 20 --subscribers 50 --searchers 5
    .venv/bin/python -m bench.events_rate --rates 50 --duration 600   # a 10-minute soak

Each step (one per-conversation rate of `--rates`) runs twice, raw first, then through the
control plane (`controlplane serve` in a process of its own on the run's private redis-server,
sandbox and conversation records written to Redis as the service writes them: no container,
the reconciler's sweep set to an hour). The load
runs in child processes, so that it does not share the server's event loop: the posters speak
the agent server's protocol with its own sender (agent/conversations/webhooks.py: one ordered
sender per conversation, what queued during a POST goes in the next), the watchers open the
events sockets and the pagers page events/search. bench/README.md says what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import random
import secrets
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from agent.conversations.webhooks import WebhookSender
from bench.burst import Server, stop_server
from bench.common import BenchError, Deployment, Samples, main_of, percentile
from controlplane.auth.service import ApiKeyService
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.crypto import SecretBox
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from tests.support.records import sandbox_record

TARGET_P99 = 0.050
TICK = 0.01
DRAIN = 15.0
"""Seconds the subscribers wait, after the last POST was answered, for the last frames."""
KEEP_SAMPLES = 200_000
PAYLOAD = "x" * 200  # an assistant message's text: events are a few hundred bytes, as agents'


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Options:
    conversations: int
    rates: list[float]
    subscribers: int
    searchers: int
    users: int
    duration: float
    posters: int
    search_interval: float
    reader_pool: int | None
    json_path: Path | None


@dataclass
class Conversation:
    sandbox_id: str
    id: str
    session_key: str
    owner_key: str


@dataclass
class StepResult:
    name: str
    rate: float
    posted: int = 0
    received: int = 0
    expected: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    wall: float = 0.0
    post_statuses: dict[str, int] = field(default_factory=dict)
    cpu: float | None = None
    rss_mib: list[float] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)
    searches: int = 0
    search_errors: int = 0
    sockets_refused: int = 0


# -- the load: child processes ------------------------------------------------------------------


def _event(seq: int) -> dict[str, Any]:
    now = datetime.now(UTC).replace(tzinfo=None)
    return {
        "id": secrets.token_hex(8),
        "timestamp": now.isoformat(timespec="microseconds"),
        "source": "agent",
        "kind": "MessageEvent",
        "llm_message": {"role": "assistant", "content": [{"type": "text", "text": PAYLOAD}]},
        "seq": seq,
    }


@dataclass
class Job:
    """What a child process of a step is given (it is pickled to a spawned process)."""

    mode: str  # "raw" or "api"
    target: str  # the Redis URL (raw) or the control plane's
    convs: list[Conversation]  # a poster's conversations; a watcher's subscriptions
    rate: float = 0.0
    duration: float = 0.0
    pagers: list[Conversation] = field(default_factory=list)
    interval: float = 1.0


class StampingSender(WebhookSender):
    """The agent server's sender, stamping each event of a POST with when the POST was sent
    (`posted_ns`, CLOCK_MONOTONIC: one clock for every process of the machine)."""

    async def _deliver(self, kind: Any, body: Any) -> None:
        now = time.perf_counter_ns()
        for item in body if isinstance(body, list) else [body]:
            item["posted_ns"] = now
        await super()._deliver(kind, body)


class Poster:
    """Events at `rate` per conversation for `duration` s, on a 10 ms tick."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.posted = dict.fromkeys((c.id for c in job.convs), 0)
        self.statuses: dict[str, int] = {}

    def due(self, elapsed: float) -> list[tuple[Conversation, dict[str, Any]]]:
        target = int(elapsed * self.job.rate) + 1
        out = []
        for c in self.job.convs:
            while self.posted[c.id] < target:
                out.append((c, _event(self.posted[c.id])))
                self.posted[c.id] += 1
        return out

    async def run(self) -> dict[str, Any]:
        if self.job.mode == "raw":
            await self.raw()
        else:
            await self.webhooks()
        return {"posted": self.posted, "statuses": self.statuses}

    async def raw(self) -> None:
        redis = aioredis.Redis.from_url(self.job.target, max_connections=4)
        begun = time.monotonic()
        while (elapsed := time.monotonic() - begun) < self.job.duration:
            pipe = redis.pipeline(transaction=False)
            now = time.perf_counter_ns()
            for c, event in self.due(elapsed):
                event["posted_ns"] = now
                pipe.xadd(f"raw:{c.id}", {"e": json.dumps(event)})
            await pipe.execute()  # one after the other: the XADDs in order, as a sender's
            await asyncio.sleep(TICK)
        self.statuses["xadd"] = sum(self.posted.values())
        await redis.aclose()

    async def webhooks(self) -> None:
        async def on_end(_s: Any, _c: Any, params: aiohttp.TraceRequestEndParams) -> None:
            status = str(params.response.status)
            self.statuses[status] = self.statuses.get(status, 0) + 1

        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(on_end)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as http:
            base = f"{self.job.target}/api/v1/webhooks"
            senders = {
                c.id: StampingSender(http, f"{base}/{c.sandbox_id}", c.id, c.session_key)
                for c in self.job.convs
            }
            for sender in senders.values():
                sender.start()
            begun = time.monotonic()
            while (elapsed := time.monotonic() - begun) < self.job.duration:
                for c, event in self.due(elapsed):
                    senders[c.id].send_event(event)
                await asyncio.sleep(TICK)
            await asyncio.gather(*(s.close(flush_timeout=60) for s in senders.values()))


def post_worker(job: Job, out: Any) -> None:
    out.put(asyncio.run(Poster(job).run()))


class Watch:
    """Every frame of one subscriber: the sequence it followed."""

    def __init__(self) -> None:
        self.last = -1
        self.received = 0
        self.duplicated = 0
        self.out_of_order = 0

    def saw(self, seq: int) -> bool:
        """Whether it is new to this subscriber."""
        self.received += 1
        if seq <= self.last:
            self.duplicated += 1
            return False
        if seq != self.last + 1:
            self.out_of_order += 1
        self.last = seq
        return True


class Watcher:
    """The subscribers (events sockets; raw: XREAD BLOCK, a connection each) and the pagers."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.latencies: list[float] = []
        self.seen = 0
        self.watches = [Watch() for _ in job.convs]
        self.search: list[float] = []
        self.errors = {"search": 0, "refused": 0}
        self.done = asyncio.Event()
        self.unique = 0  # frames that were not repeats
        self.expected: int | None = None  # every subscriber's posted events, once known
        self.all_in = asyncio.Event()

    def check_all_in(self) -> None:
        if self.expected is not None and self.unique >= self.expected:
            self.all_in.set()

    def note(self, watch: Watch, raw: str | bytes, now: int) -> None:
        event = json.loads(raw)
        if watch.saw(int(event["seq"])):
            self.unique += 1
            self.check_all_in()
        self.seen += 1
        sample = (now - int(event["posted_ns"])) / 1e9
        if len(self.latencies) < KEEP_SAMPLES:
            self.latencies.append(sample)
        elif (slot := random.randrange(self.seen)) < KEEP_SAMPLES:  # a uniform sample
            self.latencies[slot] = sample

    async def raw_reader(self, c: Conversation, watch: Watch, opened: asyncio.Event) -> None:
        redis = aioredis.Redis.from_url(self.job.target, max_connections=1)
        after = "0-0"  # a new stream: everything in it is this step's
        opened.set()
        while not self.done.is_set():
            got: Any = await redis.xread({f"raw:{c.id}": after}, block=500, count=1000)
            now = time.perf_counter_ns()
            for _key, entries in got or []:
                for stream_id, fields in entries:
                    after = stream_id
                    self.note(watch, fields[b"e"], now)
        await redis.aclose()

    async def socket(
        self, http: aiohttp.ClientSession, c: Conversation, watch: Watch, opened: asyncio.Event
    ) -> None:
        url = f"{self.job.target}/api/v1/events/socket?conversation_id={c.id}&resend_all=false"
        try:
            ws = await http.ws_connect(url, headers={"X-Session-API-Key": c.owner_key})
        except aiohttp.WSServerHandshakeError:
            self.errors["refused"] += 1
            return
        finally:
            opened.set()
        async with ws:
            while not self.done.is_set():
                try:
                    msg = await ws.receive(timeout=0.5)
                except TimeoutError:
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                self.note(watch, msg.data, time.perf_counter_ns())

    async def pager(self, http: aiohttp.ClientSession, c: Conversation) -> None:
        """Pages of 100 through the conversation's events, oldest first, from the start again
        at the end; one page every `interval` s (a client reading history, not a loop)."""
        page: str | None = None
        while not self.done.is_set():
            query = f"conversation_id__eq={c.id}&limit=100" + (f"&page_id={page}" if page else "")
            t0 = time.perf_counter()
            try:
                async with http.get(
                    f"{self.job.target}/api/v1/events/search?{query}",
                    headers={"X-Session-API-Key": c.owner_key},
                ) as resp:
                    body = await resp.json() if resp.status == 200 else None
            except aiohttp.ClientError:
                body = None
            self.search.append(time.perf_counter() - t0)
            if body is None:
                self.errors["search"] += 1
            else:
                page = body.get("next_page_id")
            await asyncio.sleep(self.job.interval)

    async def run(self, ready: Any, expect: Any) -> dict[str, Any]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            tasks: list[asyncio.Task[None]] = []
            opened: list[asyncio.Event] = []
            for c, watch in zip(self.job.convs, self.watches, strict=True):
                flag = asyncio.Event()
                opened.append(flag)
                raw = self.job.mode == "raw"
                job = self.raw_reader(c, watch, flag) if raw else self.socket(http, c, watch, flag)
                tasks.append(asyncio.create_task(job))
                if len(tasks) % 20 == 0:
                    await asyncio.sleep(0.05)  # the handshakes spread a little
            await asyncio.gather(*(f.wait() for f in opened))
            await asyncio.sleep(1.0)  # every socket's first read is blocking
            ready.set()
            if self.job.mode != "raw":
                tasks += [asyncio.create_task(self.pager(http, c)) for c in self.job.pagers]
            posted: dict[str, int] = await asyncio.to_thread(expect.get)
            self.expected = sum(posted[c.id] for c in self.job.convs)
            self.check_all_in()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.all_in.wait(), DRAIN)
            self.done.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        watched = zip(self.job.convs, self.watches, strict=True)
        return {
            "latencies": self.latencies,
            "seen": self.seen,
            "watches": [(c.id, w.received, w.duplicated, w.out_of_order) for c, w in watched],
            "search": self.search,
            "errors": self.errors,
        }


def watch_worker(job: Job, ready: Any, expect: Any, out: Any) -> None:
    """The watcher's process: `ready` set once every subscriber is in; then it reads until it
    has what `expect` says was posted (by conversation), and puts what it saw in `out`."""
    out.put(asyncio.run(Watcher(job).run(ready, expect)))


# -- the bench ----------------------------------------------------------------------------------


class EventsBench:
    def __init__(self, opt: Options, tmp: Path, redis_url: str) -> None:
        self.opt = opt
        self.tmp = tmp
        self.deploy = Deployment(tmp, redis_url, f"acs-bench-ev-{secrets.token_hex(3)}-")
        self.samples = Samples()
        self.notes: list[str] = []
        self.results_list: list[StepResult] = []
        self.server: Server | None = None
        self.mp = multiprocessing.get_context("spawn")

    def remove_everything(self) -> int:
        """No container (the records live in the private Redis, removed with it), but the
        sandbox network the server made for its webhook listener, with its firewall rules; the
        server is stopped first (here too when the run was interrupted)."""
        if self.server is not None:
            stop_server(self.server)
        return self.deploy.remove_everything()

    def close(self) -> None:
        self.deploy.close()

    def results(self) -> Any:
        return {
            "steps": [r.__dict__ for r in self.results_list],
            "samples": self.samples.values,
        }

    def rss_mib(self) -> float:
        assert self.server is not None
        assert self.server.process is not None
        for line in Path(f"/proc/{self.server.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    async def records(self, step: int) -> list[Conversation]:
        """C sandboxes with one conversation each, owned round robin by U users."""
        redis = self.deploy.redis
        store = SandboxStore(redis, SecretBox(self.deploy.secret_key.encode()))
        keys = [
            (await ApiKeyService(redis, None).create(f"ev{step}-u{i}")).key
            for i in range(self.opt.users)
        ]
        convs = []
        for i in range(self.opt.conversations):
            owner = f"ev{step}-u{i % self.opt.users}"
            session = secrets.token_urlsafe(32)
            record = sandbox_record(owner, SandboxStatus.RUNNING, session)
            assert await store.create(record, 0, Limits())
            cid = secrets.token_hex(16)
            await ConversationStore(redis).save(
                AppConversationInfo(id=cid, created_by_user_id=owner, sandbox_id=record.id)
            )
            convs.append(Conversation(record.id, cid, session, keys[i % self.opt.users]))
        return convs

    async def step(self, mode: str, rate: float, convs: list[Conversation]) -> StepResult:
        opt = self.opt
        result = StepResult(f"{mode}@{rate:g}", rate)
        assert self.server is not None
        target = self.deploy.redis_url if mode == "raw" else self.server.url
        subs = [convs[i % len(convs)] for i in range(opt.subscribers)]
        pagers = [convs[i % len(convs)] for i in range(opt.searchers)]
        job = Job(mode, target, subs, pagers=pagers, interval=opt.search_interval)
        ready, expect, out = self.mp.Event(), self.mp.Queue(), self.mp.Queue()
        watcher = self.mp.Process(target=watch_worker, args=(job, ready, expect, out))
        watcher.start()
        deadline = time.monotonic() + 120
        while not ready.is_set():
            if time.monotonic() > deadline or not watcher.is_alive():
                raise BenchError(f"{result.name}: the subscribers did not connect")
            await asyncio.sleep(0.1)
        result.load = (os.getloadavg()[0], 0.0)
        cpu0 = self.server.cpu()
        if mode == "api":
            result.rss_mib.append(self.rss_mib())
        t0 = time.monotonic()
        posted = await self.post(result, Job(mode, target, convs, rate, opt.duration))
        result.posted = sum(posted.values())
        result.expected = sum(posted[c.id] for c in subs)
        expect.put(posted)  # the watcher reads until it has them all (at most DRAIN s)
        watched = await asyncio.to_thread(out.get, True, DRAIN + 60)
        watcher.join()
        result.wall = time.monotonic() - t0
        if mode == "api":
            result.cpu = self.server.cpu() - cpu0
            result.rss_mib.append(self.rss_mib())
        result.load = (result.load[0], os.getloadavg()[0])
        self.tally(result, watched, posted)
        return result

    async def post(self, result: StepResult, job: Job) -> dict[str, int]:
        """The posters' run (the server's memory sampled meanwhile): posted by conversation."""
        out = self.mp.Queue()
        shares = [job.convs[i :: self.opt.posters] for i in range(self.opt.posters)]
        posters = [
            self.mp.Process(target=post_worker, args=(replace(job, convs=share), out))
            for share in shares
            if share
        ]
        for process in posters:
            process.start()
        sampled = time.monotonic()
        posted: dict[str, int] = {}
        for _ in posters:
            while True:
                try:
                    answer = await asyncio.to_thread(out.get, True, 1.0)
                    break
                except queue.Empty:
                    if job.mode == "api" and time.monotonic() - sampled > self.rss_every:
                        result.rss_mib.append(self.rss_mib())
                        sampled = time.monotonic()
            posted.update(answer["posted"])
            for k, v in answer["statuses"].items():
                result.post_statuses[k] = result.post_statuses.get(k, 0) + v
        for process in posters:
            process.join()
        return posted

    @property
    def rss_every(self) -> float:
        return max(5.0, self.opt.duration / 10)

    def tally(self, result: StepResult, watched: dict[str, Any], posted: dict[str, int]) -> None:
        result.received = watched["seen"]
        for cid, received, dup, ooo in watched["watches"]:
            result.lost += max(0, posted[cid] - (received - dup))
            result.duplicated += dup
            result.out_of_order += ooo
        result.searches = len(watched["search"])
        result.search_errors = watched["errors"]["search"]
        result.sockets_refused = watched["errors"]["refused"]
        for sample in watched["latencies"]:
            self.samples.add(f"{result.name}.latency", sample)
        for sample in watched["search"]:
            self.samples.add(f"{result.name}.search", sample)

    async def measure(self) -> tuple[list[str], list[str]]:
        opt = self.opt
        pool = opt.reader_pool
        env = {
            # The records have no container: the reconciler's sweep (at start-up, then hourly)
            # would mark them MISSING, which the webhooks ignore, but not during a step.
            "ACS_RECONCILE_INTERVAL": "3600",
            "ACS_WARM_POOL": "0",
            **({"ACS_REDIS_MAX_CONNECTIONS": str(pool)} if pool else {}),
        }
        self.server = Server(self.deploy, self.tmp, env)
        async with aiohttp.ClientSession() as http:
            await self.server.start(http)
        log(f"control plane at {self.server.url} (pid {self.server.process.pid})")  # type: ignore[union-attr]
        try:
            for index, rate in enumerate(opt.rates):
                convs = await self.records(index)
                for mode in ("raw", "api"):
                    log(f"step {mode} at {rate:g}/s x {opt.conversations} conversations")
                    self.results_list.append(await self.step(mode, rate, convs))
        finally:
            await self.server.stop()
        return self.table()

    def table(self) -> tuple[list[str], list[str]]:
        opt = self.opt
        lines = [
            f"events at rate: {opt.conversations} conversations, {opt.subscribers} subscribers "
            f"({opt.users} users), {opt.searchers} events/search pagers, {opt.duration:g} s a "
            "step; latency: the POST's send (raw: the XADD's) -> the frame on each socket "
            "(raw: XREAD's return)",
            "step       | events/s in | posted  | delivered | lost | dup | out of order | "
            "p50 ms | p99 ms | max ms | CPU ms / 1k events | RSS MiB start->end | load",
        ]
        missed: list[str] = []
        by_name = {r.name: r for r in self.results_list}
        for r in self.results_list:
            key = f"{r.name}.latency"
            cpu = f"{r.cpu * 1e6 / r.posted:.0f}" if r.cpu is not None and r.posted else "-"
            rss = f"{r.rss_mib[0]:.0f} -> {r.rss_mib[-1]:.0f}" if r.rss_mib else "-"
            lines.append(
                f"{r.name:<10} | {r.posted / opt.duration:>11,.0f} | {r.posted:>7} | "
                f"{r.received:>9} | {r.lost:>4} | {r.duplicated:>3} | {r.out_of_order:>12} | "
                f"{self.ms(key, 50):>6} | {self.ms(key, 99):>6} | {self.ms(key, 100):>6} | "
                f"{cpu:>18} | {rss:>18} | {r.load[0]:.1f}/{r.load[1]:.1f}"
            )
            if r.name.startswith("api"):
                statuses = ", ".join(f"{k}: {v}" for k, v in sorted(r.post_statuses.items()))
                lines.append(
                    f"  webhook answers {statuses}; sockets refused {r.sockets_refused}; "
                    f"events/search pages {r.searches} (p50 {self.ms(f'{r.name}.search', 50)} / "
                    f"p99 {self.ms(f'{r.name}.search', 99)} ms, {r.search_errors} errors)"
                )
                if r.lost or r.duplicated or r.out_of_order:
                    missed.append(f"{r.name}: lost {r.lost}, dup {r.duplicated}, "
                                  f"out of order {r.out_of_order}")  # fmt: skip
                raw = by_name.get(r.name.replace("api", "raw", 1))
                if raw is not None and self.samples.count(f"{raw.name}.latency"):
                    api99, raw99 = (
                        self.samples.p(f"{r.name}.latency", 99),
                        self.samples.p(f"{raw.name}.latency", 99),
                    )
                    lines.append(
                        f"  p99 {api99 * 1000:.1f} ms vs raw {raw99 * 1000:.1f} ms "
                        f"({api99 / raw99:.1f}x); target p99 <= {TARGET_P99 * 1000:.0f} ms: "
                        f"{'ok' if api99 <= TARGET_P99 else 'MISSED'}"
                    )
                    if api99 > TARGET_P99:
                        missed.append(f"{r.name}: p99 {api99 * 1000:.1f} ms")
        return lines, missed

    def ms(self, key: str, q: float) -> str:
        if not self.samples.count(key):
            return "-"
        return f"{percentile(self.samples.values[key], q) * 1000:.1f}"


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200, help="(200)")
    parser.add_argument(
        "--rates", default="0.5,5,50", help="events/s per conversation, a step each (0.5,5,50)"
    )
    parser.add_argument("--subscribers", type=int, default=500, help="WebSockets (500)")
    parser.add_argument("--searchers", type=int, default=50, help="events/search pagers (50)")
    parser.add_argument("--users", type=int, default=20, help="owners of it all (20)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds a step (20)")
    parser.add_argument("--posters", type=int, default=1, help="poster processes (1)")
    parser.add_argument(
        "--search-interval", type=float, default=1.0, help="s between a pager's pages (1)"
    )
    parser.add_argument(
        "--reader-pool", type=int, default=None, help="ACS_REDIS_MAX_CONNECTIONS (its default)"
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",") if r]
    except ValueError:
        parser.error("--rates takes numbers, comma-separated")
    if not rates or min(rates) <= 0 or args.conversations < 1 or args.users < 1:
        parser.error("--rates, --conversations and --users must be positive")
    return Options(
        args.conversations, rates, args.subscribers, args.searchers, args.users,
        args.duration, max(1, args.posters), args.search_interval, args.reader_pool, args.json_path,
    )  # fmt: skip


main = main_of(parse, EventsBench, "acs-events-")

if __name__ == "__main__":
    sys.exit(main(None))
