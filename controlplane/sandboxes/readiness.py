"""Knowing when a booting sandbox's agent server is up: one loop for every booting sandbox.

A task per sandbox, each polling on its own schedule, cost the server CPU in proportion to the
starts in flight (issue 12). Here one task probes the `/health` of every sandbox that is due, all
at once, then sleeps until the next one is due; a sandbox's probes back off from 20 ms to 100 ms.
Only a boot that takes longer than usual is inspected in the runtime (to report a crashed agent
server at once), and the loop ends when nothing boots.

An agent server that announces itself (ours: `POST <webhook base>/ready` once it listens,
agent/announce.py) is probed once at once (a resumed sandbox may be up already), then only when
its announcement arrives (`hint`), which makes it due at once; without one it is polled slowly
(after ANNOUNCED_FALLBACK, then every ANNOUNCED_EVERY), so a lost announcement costs time, never
the start. An announcement that arrives before its boot is registered is remembered briefly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
import structlog

from controlplane.background import stop_task
from controlplane.errors import ControlPlaneError
from drivers.base import Endpoint, RunState, SandboxDriver

log = structlog.get_logger(__name__)

FIRST_DELAY = 0.02
MAX_DELAY = 0.1
INSPECT_AFTER = 2.0  # seconds of booting before the sandbox is inspected, then every second
ANNOUNCED_FALLBACK = 1.0  # an announcing agent's second probe, when no announcement came
ANNOUNCED_EVERY = 0.5
HINT_TTL = 30.0  # how long an announcement waits for its boot to be registered


class StartFailed(ControlPlaneError):
    code = "sandbox_start_failed"
    status = 502


@dataclass
class _Boot:
    sandbox_id: str
    endpoint: Endpoint
    future: asyncio.Future[None]
    deadline: float
    due: float = 0.0
    delay: float = FIRST_DELAY
    inspect_at: float = field(default=0.0)
    announced: bool = False  # the agent announces itself: poll slowly until it does

    def reschedule(self, now: float) -> None:
        """After a failed probe."""
        if self.announced:
            self.due = now + self.delay
            self.delay = ANNOUNCED_EVERY
        else:
            self.due = now + self.delay
            self.delay = min(self.delay * 1.5, MAX_DELAY)


class ReadinessProbe:
    """`wait()` returns when the agent server answers /health with 200; one loop serves all."""

    def __init__(self, http: aiohttp.ClientSession, driver: SandboxDriver, timeout: float) -> None:
        self._http = http
        self._driver = driver
        self._timeout = timeout
        self._boots: dict[int, _Boot] = {}
        self._hints: dict[str, float] = {}  # sandbox id -> when its announcement came
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def once(self, endpoint: Endpoint) -> bool:
        try:
            async with self._http.get(
                f"http://{endpoint.host}:{endpoint.port}/health",
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    def hint(self, sandbox_id: str) -> None:
        """The sandbox's agent server says it listens: probe it now."""
        now = time.monotonic()
        found = False
        for boot in self._boots.values():
            if boot.sandbox_id == sandbox_id and not boot.future.done():
                boot.announced, boot.due, boot.delay = False, now, FIRST_DELAY
                found = True
        if found:
            self._wake.set()
            return
        self._hints = {c: t for c, t in self._hints.items() if now - t < HINT_TTL}
        self._hints[sandbox_id] = now

    async def wait(
        self, sandbox_id: str, endpoint: Endpoint | None, *, announced: bool = False
    ) -> None:
        """Wait until the agent server at `endpoint` (its AGENT_SERVER port) is healthy.
        Raises StartFailed with the reason when it does not become so. `announced`: the agent
        server announces itself when it listens (see `hint`)."""
        if endpoint is None:
            raise StartFailed("the AGENT_SERVER port was not published")
        now = time.monotonic()
        hinted = self._hints.pop(sandbox_id, None)
        if hinted is not None and now - hinted >= HINT_TTL:
            hinted = None
        boot = _Boot(
            sandbox_id=sandbox_id,
            endpoint=endpoint,
            future=asyncio.get_running_loop().create_future(),
            deadline=now + self._timeout,
            due=now,
            inspect_at=now + INSPECT_AFTER,
            announced=announced and hinted is None,
            delay=ANNOUNCED_FALLBACK if announced and hinted is None else FIRST_DELAY,
        )
        key = id(boot)
        self._boots[key] = boot
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="readiness-probe")
        try:
            await boot.future
        finally:
            self._boots.pop(key, None)

    async def close(self) -> None:
        await stop_task(self._task)
        for boot in self._boots.values():
            boot.future.cancel()

    async def _loop(self) -> None:
        try:
            await self._probe_all()
        except Exception as exc:  # a bug here must not leave starts waiting forever
            log.exception("readiness_probe_failed")
            for boot in list(self._boots.values()):
                if not boot.future.done():
                    boot.future.set_exception(StartFailed(f"readiness probe failed: {exc}"))

    async def _probe_all(self) -> None:
        # Boots whose future is done stay listed until their waiter resumes: skip them.
        while any(not b.future.done() for b in self._boots.values()):
            self._wake.clear()
            now = time.monotonic()
            due = [b for b in self._boots.values() if b.due <= now and not b.future.done()]
            results = await asyncio.gather(*(self.once(b.endpoint) for b in due))
            now = time.monotonic()
            for boot, healthy in zip(due, results, strict=True):
                if boot.future.done():
                    continue
                if healthy:
                    boot.future.set_result(None)
                elif now >= boot.deadline:
                    boot.future.set_exception(
                        StartFailed(
                            f"the agent server did not answer /health within {self._timeout:g} s"
                        )
                    )
                else:
                    boot.reschedule(now)
            await self._inspect_slow(now)
            pending = [b.due for b in self._boots.values() if not b.future.done()]
            if not pending:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, min(pending) - now))

    async def _inspect_slow(self, now: float) -> None:
        """A crashed agent server never answers: ask the runtime instead of timing out."""
        slow = [b for b in self._boots.values() if b.inspect_at <= now and not b.future.done()]
        if not slow:
            return
        states = await asyncio.gather(
            *(self._driver.inspect(b.sandbox_id) for b in slow), return_exceptions=True
        )
        for boot, state in zip(slow, states, strict=True):
            boot.inspect_at = now + 1.0
            if boot.future.done() or isinstance(state, BaseException):
                continue  # an engine blip: the next inspection or the deadline decides
            if state is None:
                boot.future.set_exception(StartFailed("the container disappeared while starting"))
            elif state.status not in (RunState.RUNNING, RunState.CREATED, RunState.RESTARTING):
                why = f": {state.error}" if state.error else ""
                boot.future.set_exception(
                    StartFailed(
                        f"the agent server exited (status {state.status.value}, exit code "
                        f"{state.exit_code}) before answering /health{why}"
                    )
                )
