"""Stopping one replica of several without failing a request or losing a start.

At SIGTERM (`controlplane serve`):

1. `/ready` answers 503 `{"status": "draining"}` at once, so a balancer that checks it stops
   sending new requests here, while the listener still accepts (`ACS_SHUTDOWN_DRAIN_DELAY`
   seconds: long enough for the balancer's checks to notice).
2. The listener closes; requests in flight finish (up to `ACS_SHUTDOWN_TIMEOUT` seconds);
   idle keep-alive connections close; events WebSockets close with 1001 (going away), and their
   clients reconnect through the balancer to another replica, resuming after their last event.
3. The services stop (the application's cleanup contexts): conversation starts and sandbox
   launches still running get what is left of `ACS_SHUTDOWN_TIMEOUT` to finish, then are handed
   over (their leases released, not left to lapse: another replica resumes them within seconds);
   the leader roles (idle reaper, warm pool) are released the same way.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from controlplane.config import ServiceConfig

log = structlog.get_logger(__name__)


class Drain:
    """This replica's shutdown: whether it has begun, and until when work may run."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        """time.monotonic() by which in-flight work must be done or handed over."""

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def begin(self, timeout: float) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + timeout

    def left(self) -> float:
        """Seconds until the deadline; 0 before a drain began (an application cleaned up
        without SIGTERM, as tests do, hands its work over at once)."""
        if self.deadline is None:
            return 0.0
        return max(0.0, self.deadline - time.monotonic())


async def begin_drain(drain: Drain, config: ServiceConfig) -> None:
    """Step 1 of the module's sequence: unready (the app's `keys.DRAIN`), then wait for the
    balancer to notice. The caller then cleans the runner up (steps 2 and 3)."""
    drain.begin(config.shutdown_timeout + config.shutdown_drain_delay)
    log.info("draining", delay_s=config.shutdown_drain_delay)
    if config.shutdown_drain_delay:
        await asyncio.sleep(config.shutdown_drain_delay)
