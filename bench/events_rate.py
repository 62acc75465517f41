"""Events at rate (issue 30, item 2): C running conversations whose agents post events at R/s
each through the real webhook route with the sandbox's session key, S WebSocket subscribers and
P clients paging events/search; delivery latency to every subscriber, none lost, duplicated or
out of order, throughput, the control plane's CPU per 1,000 events and its memory; beside the
raw Redis operation (XADD, and S readers blocked in XREAD) at the same rate in the same run.

    .venv/bin/python -m bench.events_rate                      # 200 x 50/s, 500 sockets, 50 pagers
    .venv/bin/python -m bench.events_rate --conversations 20 --subscribers 50 --searchers 5
    .venv/bin/python -m bench.events_rate --rates 50 --phase spread --duration 600 \\
        --raw-duration 60 --sample-every 30                    # the 10-minute soak
    .venv/bin/python -m bench.events_rate --replicas 2 --kill-at 20 --duration 40

Each step (one per-conversation rate of `--rates` and one phase of `--phase`) runs twice, raw
first, then through the control plane (`controlplane serve` in a process of its own on the
run's private redis-server, sandbox and conversation records written to Redis as the service
writes them: no container, the reconciler's sweep set to an hour). The load runs in child
processes, so that it does not share the server's event loop: the posters speak the agent
server's protocol with its own sender (agent/conversations/webhooks.py: one ordered sender per
conversation, what queued during a POST goes in the next), the watchers open the events sockets
and the pagers page events/search.

`--replicas 2` serves the control plane from two processes on the same Redis, the sockets and
the posters spread over both; `--kill-at S` SIGKILLs the second one S seconds into each api
step: its sockets open again on the other replica with `after=` their last event id, and its
posters' senders send their POST again to the other one (what a balancer does). The killed
replica is started again after the step. bench/README.md says what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import heapq
import itertools
import json
import multiprocessing
import os
import queue
import random
import resource
import secrets
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from agent.conversations.webhooks import POST_TIMEOUT, WebhookSender
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
TICKS = {"tick": 0.01, "spread": 0.001}
"""The posters' loop period by phase: every conversation on one 10 ms tick (all of them post at
the same instant), or each at its own phase in the period, sent within 1 ms of it."""
DRAIN = 15.0
"""Seconds the subscribers wait, after the last POST was answered, for the last frames
(--drain): a frame not in by then counts as lost."""
PER_SECOND = 1_000
"""Latency samples kept per second of posting (a uniform sample of that second's frames)."""
WINDOW = 60.0
"""Seconds of a row of the over-time table (steps of at least 3 windows)."""
AFTER_KILL = 10.0
"""Seconds after the kill counted as its aftermath in the latency before/after."""
PAYLOAD = "x" * 200  # an assistant message's text: events are a few hundred bytes, as agents'


def cpu_seconds() -> float:
    """CPU seconds this process has used (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Options:
    conversations: int
    rates: list[float]
    phases: list[str]
    subscribers: int
    searchers: int
    users: int
    duration: float
    raw_duration: float
    posters: int
    search_interval: float
    reader_pool: int | None
    replicas: int
    kill_at: float | None
    watchers: int
    drain: float
    sample_every: float
    json_path: Path | None
    trace: Path | None = None


@dataclass
class Conversation:
    sandbox_id: str
    id: str
    session_key: str
    owner_key: str


@dataclass
class Sample:
    """The server side every `--sample-every` s of an api step."""

    at: float  # s since the first POST
    cpu: float  # CPU seconds of the replicas since the step began (a killed one's until then)
    rss_mib: list[float]  # each live replica's
    delivered: int  # events whose POST was answered 2xx by then


@dataclass
class StepResult:
    name: str
    rate: float
    phase: str
    duration: float
    posted: int = 0  # events the agents made (queued in their senders)
    unsent: int = 0  # of them, still queued when the senders' flush gave up: never sent
    received: int = 0
    expected: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    wall: float = 0.0
    post_statuses: dict[str, int] = field(default_factory=dict)
    failovers: int = 0  # POSTs sent again to the other replica
    cpu_by: dict[str, float] = field(default_factory=dict)  # CPU s of each part of the run
    cpu: float | None = None
    rss_mib: list[float] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)
    searches: int = 0
    search_errors: int = 0
    sockets_refused: int = 0
    reconnects: list[tuple[int, int]] = field(default_factory=list)  # (closed, open again) ns
    killed_at: float | None = None  # s since the first POST
    started_ns: int = 0
    killed_ns: int | None = None


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
    targets: list[str]  # the Redis URL (raw) or each replica's URL
    convs: list[Conversation]  # a poster's conversations; a watcher's subscriptions
    first: list[int] = field(default_factory=list)  # each conv's replica (an index of targets)
    phases: list[float] = field(default_factory=list)  # each conv's first event, s after start
    tick: float = 0.01
    rate: float = 0.0
    duration: float = 0.0
    pagers: list[Conversation] = field(default_factory=list)
    interval: float = 1.0
    drain: float = DRAIN
    trace: str | None = None  # --trace: the directory the watchers write every frame's times to


class StampingSender(WebhookSender):
    """The agent server's sender (its batching and order), stamping each event of a POST with
    when the POST was first sent (`posted_ns`, CLOCK_MONOTONIC: one clock for every process of
    the machine). With more than one replica, a POST that failed (refused, reset, 5xx) is sent
    again at once to the next replica, as a balancer would, instead of after the sender's
    backoff to the same one."""

    def __init__(
        self, http: aiohttp.ClientSession, bases: list[str], at: int, conv: Conversation
    ) -> None:
        super().__init__(http, bases[at], conv.id, conv.session_key)
        self.bases = bases
        self.at = at
        self.conversation_id = conv.id
        self.delivered = 0
        self.failovers = 0
        self.errors = 0

    async def _deliver(self, kind: Any, body: Any) -> None:
        items = body if isinstance(body, list) else [body]
        now = time.perf_counter_ns()
        for item in items:
            item["posted_ns"] = now
        if len(self.bases) == 1:
            await super()._deliver(kind, body)  # the agent's own retry
            self.delivered += len(items)  # it returns once the POST is answered (or dropped)
            return
        delay = 0.02
        timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT)
        while True:
            url = f"{self.bases[self.at]}/events/{self.conversation_id}"
            try:
                async with self._session.post(
                    url, json=body, headers=self._headers, timeout=timeout
                ) as resp:
                    await resp.read()
                    if resp.status < 400 or (resp.status < 500 and resp.status not in (408, 429)):
                        self.delivered += len(items) if resp.status < 400 else 0
                        return
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
            self.at = (self.at + 1) % len(self.bases)
            self.failovers += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


class Poster:
    """Events at `rate` per conversation for `duration` s: conversation i's n-th event is due
    at phases[i] + n / rate, sent at the first tick of the loop from then."""

    def __init__(self, job: Job, progress: Any, clock: Any, slot: int) -> None:
        self.job = job
        self.progress = progress  # a shared array: this poster's delivered events at [slot]
        self.clock = clock  # a shared array: when this poster began posting at [slot]
        self.slot = slot
        self.posted = dict.fromkeys((c.id for c in job.convs), 0)
        self.delivered: dict[str, int] = {}  # by conversation: events answered 2xx (raw: made)
        self.statuses: dict[str, int] = {}
        # (when the conversation's next event is due, its index): the loop pops what is due.
        self.next_due = [(phase, i) for i, phase in enumerate(job.phases)]
        heapq.heapify(self.next_due)
        self.cpu0 = cpu_seconds()

    def due(self, elapsed: float) -> list[tuple[Conversation, dict[str, Any]]]:
        out = []
        while self.next_due and self.next_due[0][0] <= elapsed:
            at, i = heapq.heappop(self.next_due)
            c = self.job.convs[i]
            out.append((c, _event(self.posted[c.id])))
            self.posted[c.id] += 1
            heapq.heappush(self.next_due, (at + 1 / self.job.rate, i))
        return out

    async def run(self) -> dict[str, Any]:
        self.delivered = dict(self.posted)
        failovers = await (self.raw() if self.job.mode == "raw" else self.webhooks())
        return {
            "posted": self.posted,
            "delivered": self.delivered,
            "statuses": self.statuses,
            "failovers": failovers,
            "cpu": cpu_seconds() - self.cpu0,
        }

    async def raw(self) -> int:
        redis = aioredis.Redis.from_url(self.job.targets[0], max_connections=4)
        begun, done = time.monotonic(), 0
        self.clock[self.slot] = time.perf_counter_ns()
        while (elapsed := time.monotonic() - begun) < self.job.duration:
            pipe = redis.pipeline(transaction=False)
            now = time.perf_counter_ns()
            batch = self.due(elapsed)
            for c, event in batch:
                event["posted_ns"] = now
                pipe.xadd(f"raw:{c.id}", {"e": json.dumps(event)})
            if batch:
                await pipe.execute()  # one after the other: the XADDs in order, as a sender's
                done += len(batch)
                self.progress[self.slot] = done
            await asyncio.sleep(self.job.tick)
        self.statuses["xadd"] = sum(self.posted.values())
        await redis.aclose()
        return 0

    async def webhooks(self) -> int:
        async def on_end(_s: Any, _c: Any, params: aiohttp.TraceRequestEndParams) -> None:
            status = str(params.response.status)
            self.statuses[status] = self.statuses.get(status, 0) + 1

        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(on_end)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as http:
            bases = [f"{t}/api/v1/webhooks" for t in self.job.targets]
            senders = {
                c.id: StampingSender(http, [f"{b}/{c.sandbox_id}" for b in bases], at, c)
                for c, at in zip(self.job.convs, self.job.first, strict=True)
            }
            for sender in senders.values():
                sender.start()

            def note() -> None:
                self.progress[self.slot] = sum(s.delivered for s in senders.values())

            begun, noted = time.monotonic(), 0.0
            self.clock[self.slot] = time.perf_counter_ns()
            while (elapsed := time.monotonic() - begun) < self.job.duration:
                for c, event in self.due(elapsed):
                    senders[c.id].send_event(event)
                if elapsed - noted > 0.2:
                    note()
                    noted = elapsed
                await asyncio.sleep(self.job.tick)
            # What the senders still hold when the flush gives up is never sent: not expected.
            flush = max(60.0, self.job.drain)
            await asyncio.gather(*(s.close(flush_timeout=flush) for s in senders.values()))
            note()
            self.delivered = {cid: s.delivered for cid, s in senders.items()}
            errors = sum(s.errors for s in senders.values())
            if errors:
                self.statuses["connection error"] = errors
            return sum(s.failovers for s in senders.values())


def quiet_heap() -> None:
    """What a load process imported, kept out of its full garbage collections (as the server
    does, controlplane/heap.py): walking it stopped a watcher or a poster for 90-180 ms at a
    time, which the latency counted as the service's."""
    gc.collect()
    gc.freeze()


def post_worker(job: Job, progress: Any, clock: Any, slot: int, out: Any) -> None:
    quiet_heap()
    out.put(asyncio.run(Poster(job, progress, clock, slot).run()))


class Watch:
    """Every frame of one subscriber: the sequence it followed."""

    def __init__(self) -> None:
        self.last = -1
        self.last_id: str | None = None  # the last event's id: where a new socket resumes
        self.received = 0
        self.duplicated = 0
        self.out_of_order = 0

    def saw(self, seq: int, event_id: str) -> bool:
        """Whether it is new to this subscriber."""
        self.received += 1
        if seq <= self.last:
            self.duplicated += 1
            return False
        if seq != self.last + 1:
            self.out_of_order += 1
        self.last = seq
        self.last_id = event_id
        return True


class Watcher:
    """The subscribers (events sockets; raw: XREAD BLOCK, a connection each) and the pagers."""

    def __init__(self, job: Job) -> None:
        self.job = job
        # Latency samples by the second (CLOCK_MONOTONIC) their POST was sent: [count, samples]
        self.latencies: dict[int, tuple[list[int], list[float]]] = {}
        self.seen = 0
        self.watches = [Watch() for _ in job.convs]
        self.search: list[float] = []
        self.errors = {"search": 0, "refused": 0}
        self.reconnects: list[tuple[int, int]] = []
        self.done = asyncio.Event()
        self.unique = 0  # frames that were not repeats
        self.expected: int | None = None  # every subscriber's posted events, once known
        self.all_in = asyncio.Event()
        # Every frame's (POST sent, frame received: perf_counter_ns, seq) with --trace.
        self.trace: list[tuple[int, int, int]] | None = [] if job.trace else None

    def check_all_in(self) -> None:
        if self.expected is not None and self.unique >= self.expected:
            self.all_in.set()

    def note(self, watch: Watch, raw: str | bytes, now: int) -> None:
        event = json.loads(raw)
        if watch.saw(int(event["seq"]), str(event["id"])):
            self.unique += 1
            self.check_all_in()
        self.seen += 1
        posted = int(event["posted_ns"])
        if self.trace is not None:
            self.trace.append((posted, now, int(event["seq"])))
        count, kept = self.latencies.setdefault(posted // 1_000_000_000, ([0], []))
        count[0] += 1
        sample = (now - posted) / 1e9
        if len(kept) < PER_SECOND:
            kept.append(sample)
        elif (slot := random.randrange(count[0])) < PER_SECOND:  # a uniform sample
            kept[slot] = sample

    async def raw_reader(self, c: Conversation, watch: Watch, opened: asyncio.Event) -> None:
        redis = aioredis.Redis.from_url(self.job.targets[0], max_connections=1)
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
        self,
        http: aiohttp.ClientSession,
        c: Conversation,
        at: int,
        watch: Watch,
        opened: asyncio.Event,
    ) -> None:
        """One subscriber: a socket on replica `at`; when it closes before the end (its replica
        died), one on the next replica, resuming after the last event it received."""
        headers = {"X-Session-API-Key": c.owner_key}
        closed: int | None = None  # when the last socket closed under it
        while not self.done.is_set():
            url = f"{self.job.targets[at]}/api/v1/events/socket?conversation_id={c.id}"
            # Each step's conversations are new: from the start is from the step's start.
            url += f"&after={watch.last_id}" if watch.last_id else "&resend_all=false"
            if closed is not None and watch.last_id is None:
                url = url.replace("resend_all=false", "resend_all=true")
            ws = await self.open(http, url, headers)
            if ws == "refused" and closed is None:  # the user's cap: not a subscriber
                self.errors["refused"] += 1
                opened.set()
                return
            if not isinstance(ws, aiohttp.ClientWebSocketResponse):
                if closed is None:
                    closed = time.perf_counter_ns()  # it never opened: counted from now
                at = (at + 1) % len(self.job.targets)
                await asyncio.sleep(0.02)
                continue
            opened.set()
            if closed is not None:
                self.reconnects.append((closed, time.perf_counter_ns()))
                closed = None
            async with ws:
                while not self.done.is_set():
                    try:
                        msg = await ws.receive(timeout=0.5)
                    except TimeoutError:
                        continue
                    except (aiohttp.ClientError, OSError):
                        break
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        break
                    self.note(watch, msg.data, time.perf_counter_ns())
            if not self.done.is_set():
                closed = time.perf_counter_ns()
                at = (at + 1) % len(self.job.targets)

    @staticmethod
    async def open(
        http: aiohttp.ClientSession, url: str, headers: dict[str, str]
    ) -> aiohttp.ClientWebSocketResponse | str:
        """The socket, or why not: "refused" (429), "failed" (any other answer, or none)."""
        try:
            return await http.ws_connect(url, headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            return "refused" if exc.status == 429 else "failed"
        except (aiohttp.ClientError, OSError):
            return "failed"

    async def pager(self, http: aiohttp.ClientSession, c: Conversation, at: int) -> None:
        """Pages of 100 through the conversation's events, oldest first, from the start again
        at the end; one page every `interval` s (a client reading history, not a loop); on the
        next replica after an error."""
        page: str | None = None
        while not self.done.is_set():
            query = f"conversation_id__eq={c.id}&limit=100" + (f"&page_id={page}" if page else "")
            t0 = time.perf_counter()
            try:
                async with http.get(
                    f"{self.job.targets[at]}/api/v1/events/search?{query}",
                    headers={"X-Session-API-Key": c.owner_key},
                ) as resp:
                    body = await resp.json() if resp.status == 200 else None
            except aiohttp.ClientError:
                body = None
            self.search.append(time.perf_counter() - t0)
            if body is None:
                self.errors["search"] += 1
                at = (at + 1) % len(self.job.targets)
            else:
                page = body.get("next_page_id")
            await asyncio.sleep(self.job.interval)

    async def run(self, ready: Any, expect: Any) -> dict[str, Any]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            tasks: list[asyncio.Task[None]] = []
            opened: list[asyncio.Event] = []
            raw = self.job.mode == "raw"
            for c, watch, at in zip(self.job.convs, self.watches, self.job.first, strict=True):
                flag = asyncio.Event()
                opened.append(flag)
                job = (
                    self.raw_reader(c, watch, flag)
                    if raw
                    else self.socket(http, c, at, watch, flag)
                )
                tasks.append(asyncio.create_task(job))
                if len(tasks) % 20 == 0:
                    await asyncio.sleep(0.05)  # the handshakes spread a little
            await asyncio.gather(*(f.wait() for f in opened))
            await asyncio.sleep(1.0)  # every socket's first read is blocking
            ready.set()
            cpu0 = cpu_seconds()
            if not raw:
                tasks += [
                    asyncio.create_task(self.pager(http, c, i % len(self.job.targets)))
                    for i, c in enumerate(self.job.pagers)
                ]
            posted: dict[str, int] = await asyncio.to_thread(expect.get)
            self.expected = sum(posted[c.id] for c in self.job.convs)
            self.check_all_in()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.all_in.wait(), self.job.drain)
            self.done.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        watched = zip(self.job.convs, self.watches, strict=True)
        return {
            "latencies": {second: kept for second, (_n, kept) in self.latencies.items()},
            "seen": self.seen,
            "watches": [(c.id, w.received, w.duplicated, w.out_of_order) for c, w in watched],
            "search": self.search,
            "errors": self.errors,
            "reconnects": self.reconnects,
            "cpu": cpu_seconds() - cpu0,
        }


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The watchers' results as one."""
    latencies: dict[int, list[float]] = {}
    for part in parts:
        for second, kept in part["latencies"].items():
            latencies.setdefault(second, []).extend(kept)
    return {
        "latencies": latencies,
        "seen": sum(p["seen"] for p in parts),
        "watches": [w for p in parts for w in p["watches"]],
        "search": [s for p in parts for s in p["search"]],
        "errors": {k: sum(p["errors"][k] for p in parts) for k in ("search", "refused")},
        "reconnects": [r for p in parts for r in p["reconnects"]],
        "cpu": sum(p["cpu"] for p in parts),
    }


def watch_worker(job: Job, ready: Any, expect: Any, out: Any) -> None:
    """The watcher's process: `ready` set once every subscriber is in; then it reads until it
    has what `expect` says was posted (by conversation), and puts what it saw in `out`."""
    quiet_heap()
    watcher = Watcher(job)
    out.put(asyncio.run(watcher.run(ready, expect)))
    if job.trace is not None:
        path = Path(job.trace) / f"{job.mode}-{os.getpid()}.json"
        path.write_text(json.dumps(watcher.trace))


# -- the bench ----------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def plus(mib: list[float], digits: int = 0) -> str:
    """Each replica's figure, joined with +."""
    return "+".join(f"{m:.{digits}f}" for m in mib)


class Meter:
    """The servers of an api step: CPU and RSS sampled every --sample-every s, the last replica
    killed at --kill-at."""

    def __init__(self, bench: EventsBench, result: StepResult, progress: Any, clock: Any) -> None:
        self.bench = bench
        self.result = result
        self.progress = progress
        self.clock = clock
        self.begun = time.monotonic()  # until the first poster begins: then when it did
        self.posting = False
        self.cpu0 = {id(s): s.cpu() for s in bench.servers}
        self.cpu_at_kill = 0.0
        kill = bench.opt.kill_at
        self.victim = bench.servers[-1] if kill is not None else None

    def cpu(self) -> float:
        live = self.bench.live()
        return self.cpu_at_kill + sum(s.cpu() - self.cpu0[id(s)] for s in live)

    def sample(self) -> None:
        pids = [s.process.pid for s in self.bench.live()]  # type: ignore[union-attr]
        at = round(time.monotonic() - self.begun, 1)
        rss = [rss_mib(p) for p in pids]
        self.result.timeline.append(Sample(at, self.cpu(), rss, sum(self.progress)))

    async def tick(self) -> None:
        if not self.posting:
            if not any(self.clock):  # the posters are still starting (imports)
                return
            self.posting = True
            self.begun = min(t for t in self.clock if t) / 1e9  # perf_counter: CLOCK_MONOTONIC
        elapsed = time.monotonic() - self.begun
        kill_at, victim = self.bench.opt.kill_at, self.victim
        due = kill_at is not None and elapsed >= kill_at
        if victim is not None and due and self.result.killed_ns is None:
            assert victim.process is not None
            self.cpu_at_kill = victim.cpu() - self.cpu0[id(victim)]
            os.kill(victim.process.pid, signal.SIGKILL)
            self.result.killed_ns = time.perf_counter_ns()
            self.result.killed_at = round(elapsed, 2)
            await victim.process.wait()
            log(f"replica {victim.url} killed at {self.result.killed_at} s")
        if elapsed >= len(self.result.timeline) * self.bench.opt.sample_every:
            self.sample()


class EventsBench:
    def __init__(self, opt: Options, tmp: Path, redis_url: str) -> None:
        self.opt = opt
        self.tmp = tmp
        self.deploy = Deployment(tmp, redis_url, f"acs-bench-ev-{secrets.token_hex(3)}-")
        self.samples = Samples()
        self.notes: list[str] = []
        self.results_list: list[StepResult] = []
        self.servers: list[Server] = []
        self.mp = multiprocessing.get_context("spawn")
        self.steps = 0

    def remove_everything(self) -> int:
        """No container (the records live in the private Redis, removed with it), but the
        sandbox network the server made for its webhook listener, with its firewall rules; the
        servers are stopped first (here too when the run was interrupted)."""
        for server in self.servers:
            stop_server(server)
        return self.deploy.remove_everything()

    def close(self) -> None:
        self.deploy.close()

    def results(self) -> Any:
        return {
            "steps": [asdict(r) for r in self.results_list],
            "samples": self.samples.values,
        }

    async def redis_cpu(self) -> float:
        """CPU seconds the run's redis-server has used."""
        info: Any = await self.deploy.redis.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def live(self) -> list[Server]:
        return [s for s in self.servers if s.process is not None and s.process.returncode is None]

    async def records(self) -> list[Conversation]:
        """C sandboxes with one conversation each, owned round robin by U users (new for each
        step: a socket that opens again without an event id reads from the start)."""
        self.steps += 1
        step, redis = self.steps, self.deploy.redis
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

    async def step(
        self, mode: str, rate: float, phase: str, convs: list[Conversation]
    ) -> StepResult:
        opt = self.opt
        duration = opt.duration if mode == "api" else opt.raw_duration
        result = StepResult(f"{mode}@{rate:g}/{phase}", rate, phase, duration)
        targets = [self.deploy.redis_url] if mode == "raw" else [s.url for s in self.servers]
        subs = [convs[i % len(convs)] for i in range(opt.subscribers)]
        pagers = [convs[i % len(convs)] for i in range(opt.searchers)]
        first = [i % len(targets) for i in range(len(subs))]
        out = self.mp.Queue()
        watchers: list[tuple[Any, Any, Any]] = []  # (process, ready, expect)
        for n in range(opt.watchers):
            share = Job(
                mode, targets, subs[n :: opt.watchers], first[n :: opt.watchers],
                pagers=pagers[n :: opt.watchers], interval=opt.search_interval, drain=opt.drain,
                trace=str(opt.trace) if opt.trace else None,
            )  # fmt: skip
            ready, expect = self.mp.Event(), self.mp.Queue()
            process = self.mp.Process(target=watch_worker, args=(share, ready, expect, out))
            process.start()
            watchers.append((process, ready, expect))
        deadline = time.monotonic() + 120
        while not all(ready.is_set() for _p, ready, _e in watchers):
            if time.monotonic() > deadline or not all(p.is_alive() for p, _r, _e in watchers):
                raise BenchError(f"{result.name}: the subscribers did not connect")
            await asyncio.sleep(0.1)
        result.load = (os.getloadavg()[0], 0.0)
        t0, redis0 = time.monotonic(), await self.redis_cpu()
        # Conversation i at phase i/C of its period (spread) or every one at 0 (tick); its
        # POSTs to replica i mod N.
        phases = [(i / len(convs)) / rate if phase == "spread" else 0.0 for i in range(len(convs))]
        posts = Job(
            mode, targets, convs, [i % len(targets) for i in range(len(convs))], phases,
            TICKS[phase], rate, duration, drain=opt.drain,
        )  # fmt: skip
        posted = await self.post(result, posts)  # by conversation: the events answered 2xx
        result.expected = sum(posted[c.id] for c in subs)
        for _p, _r, expect in watchers:  # each reads until it has them all (at most --drain s)
            expect.put(posted)
        parts = [await asyncio.to_thread(out.get, True, opt.drain + 60) for _ in watchers]
        for process, _r, _e in watchers:
            process.join()
        watched = merged(parts)
        result.cpu_by["redis"] = await self.redis_cpu() - redis0
        result.cpu_by["watchers"] = watched["cpu"]
        result.wall = time.monotonic() - t0
        if mode == "api":
            result.cpu = result.cpu_by["server"] = result.timeline[-1].cpu
            result.rss_mib = [rss_mib(s.process.pid) for s in self.live()]  # type: ignore[union-attr]
        result.load = (result.load[0], os.getloadavg()[0])
        self.tally(result, watched, posted)
        return result

    async def post(self, result: StepResult, job: Job) -> dict[str, int]:
        """The posters' run (the servers sampled meanwhile, the replica killed at --kill-at):
        posted by conversation."""
        out = self.mp.Queue()
        shares = [
            (job.convs[i :: self.opt.posters], job.first[i :: self.opt.posters],
             job.phases[i :: self.opt.posters])
            for i in range(self.opt.posters)
        ]  # fmt: skip
        progress = self.mp.RawArray(ctypes.c_longlong, len(shares))
        clock = self.mp.RawArray(ctypes.c_longlong, len(shares))
        posters = [
            self.mp.Process(
                target=post_worker,
                args=(replace(job, convs=c, first=f, phases=p), progress, clock, slot, out),
            )
            for slot, (c, f, p) in enumerate(shares)
            if c
        ]
        meter = Meter(self, result, progress, clock) if job.mode == "api" else None
        for process in posters:
            process.start()
        if meter is not None:
            meter.sample()
        posted: dict[str, int] = {}  # answered, by conversation
        for _ in posters:
            while True:
                try:
                    answer = await asyncio.to_thread(out.get, True, 0.25)
                    break
                except queue.Empty:
                    if meter is not None:
                        await meter.tick()
            posted.update(answer["delivered"])
            result.posted += sum(answer["posted"].values())
            result.unsent += sum(answer["posted"].values()) - sum(answer["delivered"].values())
            result.failovers += answer["failovers"]
            result.cpu_by["posters"] = result.cpu_by.get("posters", 0.0) + answer["cpu"]
            for k, v in answer["statuses"].items():
                result.post_statuses[k] = result.post_statuses.get(k, 0) + v
        for process in posters:
            process.join()
        result.started_ns = min(t for t in clock if t)
        if meter is not None:
            meter.sample()
        return posted

    def tally(self, result: StepResult, watched: dict[str, Any], posted: dict[str, int]) -> None:
        result.received = watched["seen"]
        for cid, received, dup, ooo in watched["watches"]:
            result.lost += max(0, posted[cid] - (received - dup))
            result.duplicated += dup
            result.out_of_order += ooo
        result.searches = len(watched["search"])
        result.search_errors = watched["errors"]["search"]
        result.sockets_refused = watched["errors"]["refused"]
        result.reconnects = watched["reconnects"]
        latencies: dict[int, list[float]] = watched["latencies"]
        started = result.started_ns / 1e9
        for second in sorted(latencies):
            # By when their POST was sent: the window (WINDOW s) and the kill's before/after.
            at = second - started
            window = f"{result.name}.w{max(0, int(at // WINDOW))}"
            for sample in latencies[second]:
                self.samples.add(f"{result.name}.latency", sample)
                self.samples.add(window, sample)
            if result.killed_ns is not None:
                since = second - result.killed_ns / 1e9
                part = "before" if since < -1 else "during" if since < AFTER_KILL else "after"
                for sample in latencies[second]:
                    self.samples.add(f"{result.name}.{part}", sample)
        for sample in watched["search"]:
            self.samples.add(f"{result.name}.search", sample)
        for closed, opened in result.reconnects:
            self.samples.add(f"{result.name}.gap", (opened - closed) / 1e9)
            if result.killed_ns is not None:
                self.samples.add(f"{result.name}.kill_to_open", (opened - result.killed_ns) / 1e9)

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
        self.servers = [Server(self.deploy, self.tmp, env) for _ in range(opt.replicas)]
        async with aiohttp.ClientSession() as http:
            for server in self.servers:
                await server.start(http)
                log(f"control plane at {server.url} (pid {server.process.pid})")  # type: ignore[union-attr]
            try:
                for rate in opt.rates:
                    for phase in opt.phases:
                        convs = await self.records()
                        for mode in ("raw", "api"):
                            log(f"step {mode} at {rate:g}/s x {opt.conversations} ({phase})")
                            self.results_list.append(await self.step(mode, rate, phase, convs))
                            for server in self.servers:  # the killed one, again
                                if (
                                    server.process is not None
                                    and server.process.returncode is not None
                                ):
                                    await server.start(http)
            finally:
                for server in self.servers:
                    await server.stop()
        return self.table()

    def table(self) -> tuple[list[str], list[str]]:
        opt = self.opt
        replicas = f"{opt.replicas} replicas" if opt.replicas > 1 else "one replica"
        lines = [
            f"events at rate: {opt.conversations} conversations, {opt.subscribers} subscribers "
            f"({opt.users} users), {opt.searchers} events/search pagers, {opt.duration:g} s an "
            f"api step ({opt.raw_duration:g} s raw), {replicas}"
            + (f", the last SIGKILLed {opt.kill_at:g} s into each api step" if opt.kill_at else "")
            + "; phase: tick = every conversation posts on one 10 ms tick, spread = each at its "
            "own phase (1 ms resolution); latency: the POST's send (raw: the XADD's) -> the frame "
            "on each socket (raw: XREAD's return)",
            "step              | events/s in | posted  | delivered | lost | dup | out of order | "
            "p50 ms | p99 ms | max ms | CPU ms / 1k events | RSS MiB start->end | load",
        ]
        missed: list[str] = []
        by_name = {r.name: r for r in self.results_list}
        for r in self.results_list:
            key = f"{r.name}.latency"
            cpu = f"{r.cpu * 1e6 / r.posted:.0f}" if r.cpu is not None and r.posted else "-"
            rss = "-"
            if r.timeline:
                rss = f"{plus(r.timeline[0].rss_mib)} -> {plus(r.rss_mib)}"
            lines.append(
                f"{r.name:<17} | {r.posted / r.duration:>11,.0f} | {r.posted:>7} | "
                f"{r.received:>9} | {r.lost:>4} | {r.duplicated:>3} | {r.out_of_order:>12} | "
                f"{self.ms(key, 50):>6} | {self.ms(key, 99):>6} | {self.ms(key, 100):>6} | "
                f"{cpu:>18} | {rss:>18} | {r.load[0]:.1f}/{r.load[1]:.1f}"
            )
            parts = ", ".join(f"{k} {v:.0f}" for k, v in r.cpu_by.items())
            lines.append(
                f"  CPU s over {r.wall:.0f} s ({os.cpu_count()} cores): {parts}; per 1k events: "
                + ", ".join(f"{k} {v * 1e6 / max(r.posted, 1):.0f} ms" for k, v in r.cpu_by.items())
            )
            if not r.name.startswith("api"):
                continue
            if r.unsent:
                lines.append(
                    f"  {r.unsent:,} events still queued in the agents' senders when their flush "
                    "gave up (--drain, at least 60 s): never sent, so not expected on a socket"
                )
            statuses = ", ".join(f"{k}: {v}" for k, v in sorted(r.post_statuses.items()))
            lines.append(
                f"  webhook answers {statuses}; sockets refused {r.sockets_refused}; "
                f"events/search pages {r.searches} (p50 {self.ms(f'{r.name}.search', 50)} / "
                f"p99 {self.ms(f'{r.name}.search', 99)} ms, {r.search_errors} errors)"
            )
            if r.killed_at is not None or r.reconnects:
                lines += self.kill_lines(r)
            if r.duration >= 3 * WINDOW:
                lines += self.timeline_lines(r)
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
                if api99 > TARGET_P99 and opt.replicas == 1:
                    missed.append(f"{r.name}: p99 {api99 * 1000:.1f} ms")
        return lines, missed

    def kill_lines(self, r: StepResult) -> list[str]:
        n = r.name
        lines = [
            f"  replica killed at {r.killed_at} s: {len(r.reconnects)} sockets opened again on "
            f"the other (closed -> open again p50 {self.ms(f'{n}.gap', 50)} / p99 "
            f"{self.ms(f'{n}.gap', 99)} / max {self.ms(f'{n}.gap', 100)} ms; kill -> open again "
            f"max {self.ms(f'{n}.kill_to_open', 100)} ms); {r.failovers} POSTs sent again to the "
            "other replica"
        ]
        parts = [
            f"{label} p50 {self.ms(f'{n}.{part}', 50)} / p99 {self.ms(f'{n}.{part}', 99)} / max "
            f"{self.ms(f'{n}.{part}', 100)} ms"
            for part, label in (
                ("before", "before the kill"),
                ("during", f"its first {AFTER_KILL:g} s"),
                ("after", "after"),
            )
            if self.samples.count(f"{n}.{part}")
        ]
        if parts:
            lines.append("  latency (by the POST's send): " + "; ".join(parts))
        return lines

    def timeline_lines(self, r: StepResult) -> list[str]:
        lines = [
            "  over time: RSS MiB every sample: "
            + ", ".join(f"{s.at:g}s {plus(s.rss_mib, 1)}" for s in r.timeline),
            "  window s  | events/s in | CPU ms / 1k events | p50 ms | p99 ms | max ms",
        ]
        marks = [
            s
            for s in r.timeline
            if s.at % WINDOW < self.opt.sample_every / 2 or s is r.timeline[-1]
        ]
        for index, (a, b) in enumerate(itertools.pairwise(marks)):
            events = b.delivered - a.delivered
            cpu = f"{(b.cpu - a.cpu) * 1e6 / events:.0f}" if events else "-"
            key = f"{r.name}.w{index}"
            rate = events / max(b.at - a.at, 1e-9)
            lines.append(
                f"  {a.at:>4g}-{b.at:<4g} | {rate:>11,.0f} | {cpu:>18} | "
                f"{self.ms(key, 50):>6} | {self.ms(key, 99):>6} | {self.ms(key, 100):>6}"
            )
        return lines

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
    parser.add_argument(
        "--phase",
        default="tick,spread",
        help="tick (every conversation posts on one 10 ms tick), spread (each at its own phase), "
        "or both, a step each (tick,spread)",
    )
    parser.add_argument("--subscribers", type=int, default=500, help="WebSockets (500)")
    parser.add_argument("--searchers", type=int, default=50, help="events/search pagers (50)")
    parser.add_argument("--users", type=int, default=20, help="owners of it all (20)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds an api step (20)")
    parser.add_argument(
        "--raw-duration", type=float, default=None, help="seconds a raw step (--duration)"
    )
    parser.add_argument("--posters", type=int, default=1, help="poster processes (1)")
    parser.add_argument(
        "--search-interval", type=float, default=1.0, help="s between a pager's pages (1)"
    )
    parser.add_argument(
        "--reader-pool", type=int, default=None, help="ACS_REDIS_MAX_CONNECTIONS (its default)"
    )
    parser.add_argument("--replicas", type=int, default=1, help="control plane processes (1)")
    parser.add_argument(
        "--kill-at", type=float, default=None, help="SIGKILL the last replica S s into a step"
    )
    parser.add_argument(
        "--sample-every", type=float, default=None, help="s between CPU/RSS samples (duration/10)"
    )
    parser.add_argument(
        "--watchers", type=int, default=1, help="processes holding the subscribers (1)"
    )
    parser.add_argument(
        "--drain", type=float, default=DRAIN, help="s to wait for the last frames (15)"
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="a directory: each watcher writes every frame's (POST sent, received ns, seq) there",
    )
    args = parser.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",") if r]
    except ValueError:
        parser.error("--rates takes numbers, comma-separated")
    if not rates or min(rates) <= 0 or args.conversations < 1 or args.users < 1:
        parser.error("--rates, --conversations and --users must be positive")
    phases = [p for p in args.phase.split(",") if p]
    if not phases or any(p not in TICKS for p in phases):
        parser.error("--phase takes tick, spread or tick,spread")
    if args.replicas < 1 or (args.kill_at is not None and args.replicas < 2):
        parser.error("--kill-at needs --replicas 2 or more")
    if args.kill_at is not None and not 0 < args.kill_at < args.duration:
        parser.error("--kill-at must fall inside --duration")
    every = args.sample_every or max(5.0, args.duration / 10)
    return Options(
        args.conversations, rates, phases, args.subscribers, args.searchers, args.users,
        args.duration, args.raw_duration or args.duration, max(1, args.posters),
        args.search_interval, args.reader_pool, args.replicas, args.kill_at,
        max(1, args.watchers), args.drain, every, args.json_path, args.trace,
    )  # fmt: skip


main = main_of(parse, EventsBench, "acs-events-")

if __name__ == "__main__":
    sys.exit(main(None))
