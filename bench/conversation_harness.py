"""The conversation benchmarks' harness (bench/conversations.py, bench/warm_pool.py): the app
served with a private Redis, the scripted fake LLM on the sandbox network's gateway, timing marks
on the app's own start path and event path, the raw Docker path of the same conversations, and
the fan-out client that runs in a child process (`python -m bench.conversations
--fanout-client`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from bench.common import (
    BenchError,
    Deployment,
    Samples,
    Served,
    serve,
)
from controlplane import keys
from controlplane.auth.service import ApiKeyService
from controlplane.sandboxes.models import SandboxStatus
from tests.support.fake_llm import FakeLLM, reply_finish
from tests.support.live_server import free_port

CLIENT_POLL = 0.010
"""The client's GET interval on the start task (what a UI does)."""
FINISH_POLL = 0.05
STATUS_TIMEOUT = 120.0
FINISH_TIMEOUT = 20.0
DELIVERY_TIMEOUT = 60.0
TARGET_READY_NEW_S = 2.0
TARGET_FANOUT_P95_S = 0.050
FANOUT_WARMUP_EVENTS = 100
USER = "bench-conv"
RATE_LIMIT = 1_000_000
LLM_KEY = "sk-bench-" + secrets.token_hex(8)
MODEL = "fake-model"
WEBHOOK_ROUTE = "POST /api/v1/webhooks/{sandbox_id}/events/{conversation_id}"
START_ROUTE = "POST /api/v1/app-conversations"
TASKS_ROUTE = "GET /api/v1/app-conversations/start-tasks"

# Segments of one start, between named instants (see Timeline). "client.post" is the moment the
# client sent the POST, "client.ready" the answer of the first GET that showed READY.
NEW_SEGMENTS: list[tuple[str, str, str]] = [
    ("POST -> task WAITING_FOR_SANDBOX saved", "client.post", "task.WAITING_FOR_SANDBOX"),
    ("-> Docker calls begin (image check, record)", "task.WAITING_FOR_SANDBOX", "docker.begin"),
    ("Docker: image, volume, create, start, inspect", "docker.begin", "docker.end"),
    ("agent server boot + HealthProbe /health", "docker.end", "probe.end"),
    ("-> RUNNING compare-and-set", "probe.end", "sandbox.running"),
    ("-> start task sees RUNNING (wait_running)", "sandbox.running", "starter.running"),
    ("-> agent POST begins (task saves, record)", "starter.running", "agent.begin"),
    ("agent POST /api/conversations round trip", "agent.begin", "agent.end"),
    ("-> task READY saved", "agent.end", "task.READY"),
    ("READY saved -> client sees it (10 ms poll)", "task.READY", "client.ready"),
]
EXISTING_SEGMENTS: list[tuple[str, str, str]] = [
    ("POST -> task WAITING_FOR_SANDBOX saved", "client.post", "task.WAITING_FOR_SANDBOX"),
    (
        "-> sandbox checked RUNNING (owned, touch, get)",
        "task.WAITING_FOR_SANDBOX",
        "starter.running",
    ),
    ("-> agent POST begins (task saves, record)", "starter.running", "agent.begin"),
    ("agent POST /api/conversations round trip", "agent.begin", "agent.end"),
    ("-> task READY saved", "agent.end", "task.READY"),
    ("READY saved -> client sees it (10 ms poll)", "task.READY", "client.ready"),
]


# -- instrumentation ---------------------------------------------------------------------------


class Timeline:
    """Instants (perf_counter seconds) of the start being measured, first occurrence wins.

    Filled by wrappers around the app's service objects (instrument()); runs are sequential, so
    one timeline at a time is enough.
    """

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}

    def reset(self) -> None:
        self.marks = {}

    def mark(self, name: str, at: float) -> None:
        self.marks.setdefault(name, at)


@dataclass
class FanoutMarks:
    """Server-side instants (perf_counter_ns) per benchmark event sequence number."""

    appended: dict[int, int] = field(default_factory=dict)
    read: dict[int, int] = field(default_factory=dict)


Hook = Callable[[tuple[Any, ...], dict[str, Any], Any, float, float], None]


def wrap(obj: object, name: str, hook: Hook) -> None:
    """Replace the coroutine method `name` on this instance by one that calls
    hook(args, kwargs, result, begin, end) after it returns. Only this object changes."""
    original: Callable[..., Awaitable[Any]] = getattr(obj, name)

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        result = await original(*args, **kwargs)
        hook(args, kwargs, result, begin, time.perf_counter())
        return result

    setattr(obj, name, timed)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _ends(timeline: Timeline, name: str) -> Hook:
    def hook(_a: tuple[Any, ...], _k: dict[str, Any], _r: Any, _b: float, end: float) -> None:
        timeline.mark(name, end)

    return hook


def instrument_starts(
    app: web.Application, timeline: Timeline, bodies: list[dict[str, Any]]
) -> None:
    """Mark the instants of a start; keep the bodies the control plane sends to the agent."""
    sandboxes = app[keys.SANDBOXES]
    conversations = app[keys.CONVERSATIONS]

    def task_saved(
        args: tuple[Any, ...], kw: dict[str, Any], _r: Any, _b: float, end: float
    ) -> None:
        timeline.mark(f"task.{_arg(args, kw, 0, 'task').status.value}", end)

    def docker(_a: tuple[Any, ...], _k: dict[str, Any], _r: Any, begin: float, end: float) -> None:
        timeline.mark("docker.begin", begin)
        timeline.mark("docker.end", end)

    def transition(
        args: tuple[Any, ...], kw: dict[str, Any], result: Any, _b: float, end: float
    ) -> None:
        if _arg(args, kw, 2, "to") == SandboxStatus.RUNNING and result.outcome == "ok":
            timeline.mark("sandbox.running", end)

    def agent_start(
        args: tuple[Any, ...], kw: dict[str, Any], _r: Any, begin: float, end: float
    ) -> None:
        timeline.mark("agent.begin", begin)
        timeline.mark("agent.end", end)
        bodies.append(dict(_arg(args, kw, 2, "body")))

    wrap(conversations.store, "save_task", task_saved)
    wrap(sandboxes.driver, "create", docker)
    wrap(sandboxes.probe, "wait", _ends(timeline, "probe.end"))
    wrap(sandboxes.store, "transition", transition)
    wrap(sandboxes, "wait_running", _ends(timeline, "starter.running"))
    wrap(conversations.agent, "start_conversation", agent_start)


def instrument_events(app: web.Application, fan: FanoutMarks) -> None:
    """Mark, per benchmark event, when its append returned and when a socket's XREAD did."""

    def appended(args: tuple[Any, ...], kw: dict[str, Any], _r: Any, _b: float, _e: float) -> None:
        now = time.perf_counter_ns()
        for event in _arg(args, kw, 1, "events"):
            if isinstance(event.get("bench_seq"), int):
                fan.appended[event["bench_seq"]] = now

    def followed(
        _a: tuple[Any, ...], _k: dict[str, Any], result: Any, _b: float, _e: float
    ) -> None:
        now = time.perf_counter_ns()
        for _sid, event in result:
            if isinstance(event.get("bench_seq"), int):
                fan.read[event["bench_seq"]] = now

    events = app[keys.CONVERSATIONS].events  # the EventStore the webhook and the socket use
    wrap(events, "append", appended)
    wrap(events, "follow", followed)


# -- the app under test --------------------------------------------------------------------------


def message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "run": True}


# -- the benchmark -------------------------------------------------------------------------------


@dataclass
class Options:
    runs: int
    warmup: int
    settle: float
    events: int
    batches: int
    batch_size: int
    json_path: Path | None


@dataclass
class RawSandbox:
    container: Any
    volume: Any
    port: int
    key: str


class Bench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.opt = options
        self.tmp = tmp
        self.redis_url = redis_url
        self.prefix = f"acs-bench-conv-{secrets.token_hex(4)}-"
        self.samples = Samples()
        self.timeline = Timeline()
        self.fan = FanoutMarks()
        self.agent_bodies: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.fanout: dict[str, Any] = {}
        # The deployment supplies the raw Docker path (same container as the API asks for,
        # same SDK calls as the driver), the environment line and the clean-up.
        self.raw = Deployment(tmp, redis_url, self.prefix)
        self.redis = self.raw.redis
        self.api: aiohttp.ClientSession | None = None
        self.agent_http: aiohttp.ClientSession | None = None
        self.key = ""

    # -- HTTP helpers ----------------------------------------------------------------------

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.api is not None
        async with self.api.request(
            method, path, json=body, headers={"X-Session-API-Key": self.key}
        ) as resp:
            if resp.content_type != "application/json":
                return resp.status, await resp.text()
            return resp.status, await resp.json()

    async def expect(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        if status != 200:
            raise BenchError(f"{method} {path} answered {status}: {answer}")
        return answer

    async def agent_call(
        self, method: str, port: int, key: str, path: str, body: Any = None
    ) -> Any:
        assert self.agent_http is not None
        async with self.agent_http.request(
            method,
            f"http://127.0.0.1:{port}{path}",
            json=body,
            headers={"X-Session-API-Key": key},
        ) as resp:
            answer = await resp.json(content_type=None)
            if resp.status >= 300:
                raise BenchError(f"agent {method} {path} answered {resp.status}: {answer}")
            return answer

    # -- one start through the API -----------------------------------------------------------

    async def api_start(
        self, sandbox_id: str | None, kind: str | None, *, initial_message: bool = True
    ) -> dict[str, Any]:
        """POST a start, GET its task at once and then every CLIENT_POLL until READY.

        kind "new"/"existing" records the samples, None records nothing. Returns the task.
        """
        body: dict[str, Any] = {}
        if initial_message:  # the fake LLM answers `finish`: one LLM call, then the agent stops
            body["initial_message"] = message("benchmark: finish at once")
        if sandbox_id is not None:
            body["sandbox_id"] = sandbox_id
        self.timeline.reset()
        t0 = time.perf_counter()
        task = await self.expect("POST", "/api/v1/app-conversations", body)
        t_post = time.perf_counter()
        deadline = time.monotonic() + STATUS_TIMEOUT
        while True:
            t = time.perf_counter()
            (task,) = await self.expect(
                "GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}"
            )
            seen = time.perf_counter()
            if kind is not None:
                self.samples.add("client.get_task", seen - t)
            if task["status"] == "READY":
                break
            if task["status"] == "ERROR" or time.monotonic() > deadline:
                raise BenchError(f"start task {task['id']}: {task['status']} {task['detail']}")
            await asyncio.sleep(CLIENT_POLL)
        if kind is not None:
            marks = {**self.timeline.marks, "client.post": t0, "client.ready": seen}
            self.record_start(kind, marks, t_post - t0)
        return dict(task)

    def record_start(self, kind: str, marks: dict[str, float], post: float) -> None:
        add = self.samples.add
        total = marks["client.ready"] - marks["client.post"]
        add(f"{kind}.ready", total)
        add(f"{kind}.client_post", post)
        segments = NEW_SEGMENTS if kind == "new" else EXISTING_SEGMENTS
        missing = [m for _l, a, b in segments for m in (a, b) if m not in marks]
        if missing:
            raise BenchError(f"{kind} start: instants not observed: {sorted(set(missing))}")
        for label, a, b in segments:
            add(f"{kind}.seg.{label}", marks[b] - marks[a])
        agent = marks["agent.end"] - marks["agent.begin"]
        notice = marks["client.ready"] - marks["task.READY"]
        sandbox = marks["probe.end"] - marks["docker.begin"] if kind == "new" else 0.0
        add(f"{kind}.agent", agent)
        add(f"{kind}.notice", notice)
        if kind == "new":
            add("new.sandbox_start", marks["sandbox.running"] - marks["task.WAITING_FOR_SANDBOX"])
            add("new.docker", marks["docker.end"] - marks["docker.begin"])
            add("new.probe", marks["probe.end"] - marks["docker.end"])
        # Everything that is neither Docker, the agent's boot and reply, nor the client's poll.
        add(f"{kind}.cp_own", total - sandbox - agent - notice)

    async def wait_finished(self, conversation_id: str) -> None:
        """Untimed: let the agent finish (one fake LLM call) so it does not overlap the next run."""
        deadline = time.monotonic() + FINISH_TIMEOUT
        while time.monotonic() < deadline:
            body = await self.expect("GET", f"/api/v1/app-conversations/{conversation_id}")
            if body["execution_status"] in ("finished", "error", "stuck"):
                return
            await asyncio.sleep(FINISH_POLL)
        self.notes.append(f"conversation {conversation_id} not finished after {FINISH_TIMEOUT:g} s")

    async def api_run(self, sandbox_id: str | None, kind: str | None) -> None:
        task = await self.api_start(sandbox_id, kind)
        cid = task["app_conversation_id"]
        await self.wait_finished(cid)
        # Deletes the sandbox too when no other conversation uses it (the new-sandbox runs).
        await self.expect("DELETE", f"/api/v1/app-conversations/{cid}")
        await asyncio.sleep(self.opt.settle)

    # -- the raw path --------------------------------------------------------------------------

    def agent_body(self) -> dict[str, Any]:
        """The body the control plane sent to the agent, with a fresh conversation id."""
        if not self.agent_bodies:
            raise BenchError("no agent request body captured yet")
        return {**self.agent_bodies[0], "conversation_id": uuid.uuid4().hex}

    async def raw_create(self) -> tuple[RawSandbox, float, float, float]:
        """Create, start and await /health for a container as the API makes it, without the
        webhook URL (no control plane listens for it). (sandbox, t0, after inspect, healthy)."""
        request = self.raw.raw_request()
        request.env.pop("OH_WEBHOOKS_0_BASE_URL", None)
        t0 = time.perf_counter()
        volume, container, _started, port = await asyncio.to_thread(
            self.raw.raw_create_start, request
        )
        t_docker = time.perf_counter()
        healthy = await self.raw.health(port)
        raw = RawSandbox(container, volume, port, request.env["OH_SESSION_API_KEYS_0"])
        return raw, t0, t_docker, healthy

    async def raw_conversation(self, raw: RawSandbox) -> tuple[str, float]:
        """POST /api/conversations straight to the agent; (conversation id, duration)."""
        body = self.agent_body()
        t = time.perf_counter()
        await self.agent_call("POST", raw.port, raw.key, "/api/conversations", body)
        return str(body["conversation_id"]), time.perf_counter() - t

    async def raw_finish(self, raw: RawSandbox, cid: str) -> None:
        deadline = time.monotonic() + FINISH_TIMEOUT
        path = f"/api/conversations/{cid}"
        while time.monotonic() < deadline:
            info = await self.agent_call("GET", raw.port, raw.key, path)
            if info["execution_status"] in ("finished", "error", "stuck"):
                return
            await asyncio.sleep(FINISH_POLL)
        self.notes.append(f"raw conversation {cid} not finished after {FINISH_TIMEOUT:g} s")

    async def raw_remove(self, raw: RawSandbox) -> None:
        def remove() -> None:
            raw.container.remove(force=True, v=True)
            raw.volume.remove(force=True)

        await asyncio.to_thread(remove)

    async def raw_new_run(self, record: bool) -> None:
        raw, t0, t_docker, healthy = await self.raw_create()
        cid, post = await self.raw_conversation(raw)
        if record:
            add = self.samples.add
            add("raw_new.docker", t_docker - t0)
            add("raw_new.start", healthy - t0)
            add("raw_new.boot", healthy - t_docker)
            add("raw_new.agent", post)
            add("raw_new.ready", healthy - t0 + post)
        await self.raw_finish(raw, cid)
        await self.raw_remove(raw)
        await asyncio.sleep(self.opt.settle)

    async def raw_existing_run(self, raw: RawSandbox, record: bool) -> None:
        cid, post = await self.raw_conversation(raw)
        if record:
            self.samples.add("raw_existing.agent", post)
        await self.raw_finish(raw, cid)
        await self.agent_call("DELETE", raw.port, raw.key, f"/api/conversations/{cid}")
        await asyncio.sleep(self.opt.settle)

    # -- phases --------------------------------------------------------------------------------

    def progress(self, i: int) -> bool:
        record = i >= self.opt.warmup
        label = f"run {i - self.opt.warmup + 1}/{self.opt.runs}" if record else "warm-up"
        print(f"  {label} ...", end="", flush=True, file=sys.stderr)
        return record

    async def new_sandbox_phase(self) -> None:
        """API and raw runs alternate (API first on even runs), one sandbox at a time."""
        print(f"READY with a new sandbox: {self.opt.runs} runs", file=sys.stderr)
        for i in range(self.opt.warmup + self.opt.runs):
            record = self.progress(i)
            kind = "new" if record else None
            if i % 2 == 0 or not self.agent_bodies:
                await self.api_run(None, kind)
                await self.raw_new_run(record)
            else:
                await self.raw_new_run(record)
                await self.api_run(None, kind)
            print(" done", file=sys.stderr)

    async def existing_sandbox_phase(self, sandbox_id: str) -> None:
        print(f"READY in an existing sandbox: {self.opt.runs} runs", file=sys.stderr)
        raw, *_ = await self.raw_create()
        try:
            for i in range(self.opt.warmup + self.opt.runs):
                record = self.progress(i)
                kind = "existing" if record else None
                if i % 2 == 0:
                    await self.api_run(sandbox_id, kind)
                    await self.raw_existing_run(raw, record)
                else:
                    await self.raw_existing_run(raw, record)
                    await self.api_run(sandbox_id, kind)
                print(" done", file=sys.stderr)
        finally:
            await self.raw_remove(raw)

    async def fanout_phase(self, base_url: str, sandbox_id: str) -> None:
        """One idle conversation; a child process posts events to its webhook and reads them
        from its socket. Two passes: one event per request, then batches."""
        task = await self.api_start(sandbox_id, None, initial_message=False)  # stays idle
        cid = task["app_conversation_id"]
        sandbox = await self.expect("GET", f"/api/v1/sandboxes/{sandbox_id}")
        spec: dict[str, Any] = {
            "base_url": base_url,
            "sandbox_id": sandbox_id,
            "conversation_id": cid,
            "session_key": sandbox["session_api_key"],
            "user_key": self.key,
        }
        passes = (
            ("single", self.opt.events, 1),
            ("burst", self.opt.batches * self.opt.batch_size, self.opt.batch_size),
        )
        for name, count, batch in passes:
            print(f"fan-out, {name}: {count} events, {batch} per request ...", file=sys.stderr)
            self.samples.drop(f"server:{WEBHOOK_ROUTE}")
            self.fan.appended.clear()
            self.fan.read.clear()
            result = await run_fanout_child({**spec, "phase": name, "count": count, "batch": batch})
            self.fanout[name] = result
            self.record_fanout(name, result)
            self.samples.values[f"{name}.server_webhook"] = self.samples.values.pop(
                f"server:{WEBHOOK_ROUTE}", []
            )
        await self.expect("DELETE", f"/api/v1/app-conversations/{cid}")

    def record_fanout(self, name: str, result: dict[str, Any]) -> None:
        add = self.samples.add
        for seq, sent, received in result["events"]:
            add(f"{name}.latency", (received - sent) / 1e9)
            appended = self.fan.appended.get(seq)
            read = self.fan.read.get(seq)
            if appended is not None and read is not None:
                add(f"{name}.to_appended", (appended - sent) / 1e9)
                add(f"{name}.to_read", (read - sent) / 1e9)
                add(f"{name}.to_client", (received - read) / 1e9)
        for seconds in result["hooks"]:
            add(f"{name}.webhook", seconds)
        if result["missing"]:
            self.notes.append(f"fan-out {name}: {result['missing']} events never arrived")
        if not result["in_order"]:
            self.notes.append(f"fan-out {name}: events arrived out of order")

    # -- the whole run (run_main) -----------------------------------------------------------

    def results(self) -> Any:
        return self.samples.values

    def remove_everything(self) -> int:
        return self.raw.remove_everything()

    def close(self) -> None:
        self.raw.close()

    @contextlib.asynccontextmanager
    async def served_with_model(self, **overrides: Any) -> AsyncIterator[tuple[Served, FakeLLM]]:
        """The app served (the deployment's configuration with `overrides`), the raw path on
        its sandbox network, and the scripted model on that network's gateway (its port open to
        the sandboxes), answering every call with `finish`; the start path instrumented."""
        fake_port = free_port()  # opened to the sandboxes by the configuration below
        # The limiter on, so its cost is measured, but out of reach: the 10 ms poll alone makes
        # ~6,000 requests a minute on one key.
        config = self.raw.config(
            **({"rate_limit_per_minute": RATE_LIMIT, "sandbox_host_ports": [fake_port]} | overrides)
        )
        async with serve(config, self.samples) as served:
            self.raw.api_config = served.config
            await self.raw.attach(served.app)
            assert self.raw.attachment is not None
            fake = FakeLLM(
                host=self.raw.attachment.gateway,
                port=fake_port,
                model=MODEL,
                api_key=LLM_KEY,
                when_exhausted=reply_finish(),
            )
            await fake.start()
            try:
                instrument_starts(served.app, self.timeline, self.agent_bodies)
                yield served, fake
            finally:
                await fake.close()

    async def run(self) -> None:
        self.raw.preflight()
        # READY on a new sandbox means a cold one here (bench/warm_pool.py measures the pool).
        async with self.served_with_model(warm_pool=0) as (served, fake):
            instrument_events(served.app, self.fan)
            await self.phases(served, fake)

    async def open_as(self, url: str, fake: FakeLLM, user: str) -> None:
        """The client sessions (to the API at `url`, to agent servers), and `user`'s key with
        LLM settings pointing at the scripted model (close_sessions ends them)."""
        self.api = aiohttp.ClientSession(base_url=url)
        self.agent_http = aiohttp.ClientSession()
        self.raw.health_http = self.agent_http
        self.key = (await ApiKeyService(self.redis, None).create(user)).key
        settings = {
            "llm_model": MODEL,
            "llm_base_url": fake.container_base_url,
            "llm_api_key": LLM_KEY,
        }
        await self.expect("POST", "/api/settings", settings)

    async def close_sessions(self) -> None:
        for session in (self.api, self.agent_http):
            if session is not None:
                await session.close()
        self.api = self.agent_http = None

    async def phases(self, served: Served, fake: FakeLLM) -> None:
        try:
            await self.open_as(served.url, fake, USER)
            others = await asyncio.to_thread(self.raw.foreign_containers)
            if others:
                self.notes.append(f"{others} other containers were running at the start")
            await self.new_sandbox_phase()
            anchor = await self.api_start(None, None)  # keeps its sandbox alive between runs
            await self.wait_finished(anchor["app_conversation_id"])
            await self.existing_sandbox_phase(anchor["sandbox_id"])
            await self.fanout_phase(served.url, anchor["sandbox_id"])
            await self.expect(
                "DELETE", f"/api/v1/app-conversations/{anchor['app_conversation_id']}"
            )
            self.samples.drop("server:GET /api/v1/app-conversations/{conversation_id}")
            if fake.requests and any(r.status != 200 for r in fake.requests):
                self.notes.append("the fake LLM answered some requests with an error")
        finally:
            await self.close_sessions()


# -- the fan-out client (child process) -----------------------------------------------------


async def run_fanout_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run this file with --fanout-client; spec on stdin, the result as JSON on stdout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.conversations",
        "--fanout-client",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        out, _ = await proc.communicate(json.dumps(spec).encode())
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise BenchError(f"fan-out client exited with status {proc.returncode}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def bench_event(phase: str, seq: int, sent_at: int) -> dict[str, Any]:
    text = f"benchmark event {seq}: " + "lorem ipsum dolor sit amet " * 6
    return {
        "id": str(uuid.uuid4()),
        "kind": "MessageEvent",
        "timestamp": datetime.now(UTC).isoformat(),
        "source": "agent",
        "llm_message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
        "sent_at": sent_at,
        "bench_seq": seq,
        "bench_phase": phase,
    }


class FanoutClient:
    """Posts events to the webhook as an agent would, and reads them from the live socket."""

    def __init__(self, http: aiohttp.ClientSession, spec: dict[str, Any]) -> None:
        self.http = http
        self.spec = spec
        base, sid, cid = spec["base_url"], spec["sandbox_id"], spec["conversation_id"]
        self.hook_url = f"{base}/api/v1/webhooks/{sid}/events/{cid}"
        self.socket_url = (
            f"{base}/api/v1/events/socket?conversation_id={cid}"
            f"&session_api_key={spec['user_key']}&resend_all=false"
        )
        self.headers = {
            "X-Session-API-Key": spec["session_key"],
            "Content-Type": "application/json",
        }
        self.received: dict[str, list[tuple[int, int, int]]] = {}
        self.arrived = asyncio.Event()
        self.seq = itertools.count()

    async def pump(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            now = time.perf_counter_ns()
            if msg.type != WSMsgType.TEXT:
                continue
            event = json.loads(msg.data)
            phase = event.get("bench_phase")
            if isinstance(phase, str):
                self.received.setdefault(phase, []).append(
                    (event["bench_seq"], event["sent_at"], now)
                )
                self.arrived.set()

    async def post(self, phase: str, n: int) -> float:
        """One webhook request with n events stamped now; its duration in seconds."""
        t = time.perf_counter_ns()
        body = json.dumps([bench_event(phase, next(self.seq), t) for _ in range(n)])
        async with self.http.post(self.hook_url, data=body, headers=self.headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise BenchError(f"webhook answered {resp.status}")
        return (time.perf_counter_ns() - t) / 1e9

    async def delivered(self, phase: str, count: int) -> None:
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while len(self.received.get(phase, [])) < count and time.monotonic() < deadline:
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), max(0.0, deadline - time.monotonic()))

    async def run(self) -> dict[str, Any]:
        phase, count, batch = self.spec["phase"], int(self.spec["count"]), int(self.spec["batch"])
        ws = await self.http.ws_connect(self.socket_url)
        reader = asyncio.create_task(self.pump(ws))
        try:
            for _ in range(FANOUT_WARMUP_EVENTS // batch or 1):
                await self.post("warmup", batch)
            await self.delivered("warmup", (FANOUT_WARMUP_EVENTS // batch or 1) * batch)
            hooks: list[float] = []
            first = time.perf_counter_ns()
            for _ in range(count // batch):
                hooks.append(await self.post(phase, batch))
            last_response = time.perf_counter_ns()
            await self.delivered(phase, count)
        finally:
            await ws.close()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        events = self.received.get(phase, [])
        seqs = [e[0] for e in events]
        return {
            "events": events,
            "hooks": hooks,
            "first_send": first,
            "last_response": last_response,
            "last_receive": max((e[2] for e in events), default=first),
            "missing": count - len(events),
            "in_order": seqs == sorted(seqs) and len(set(seqs)) == len(seqs),
        }


async def fanout_client_main() -> int:
    spec = json.loads(sys.stdin.read())
    async with aiohttp.ClientSession() as http:
        result = await FanoutClient(http, spec).run()
    print(json.dumps(result))
    return 0
