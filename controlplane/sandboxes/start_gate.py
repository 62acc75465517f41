"""How many sandboxes boot at once on this replica, and how many may wait for their turn.

A hundred agent servers booting at once on two cores each take ~90 s, past the start time-out,
where the same hundred booted a few at a time each take a few seconds and the last is served no
later (issue 30). So a replica boots at most `slots` at once (ACS_MAX_CONCURRENT_STARTS); the
others wait in order, STARTING, and their start time-out counts from their turn. A user's start
(a create, or a resume or rewind that boots) is admitted (`admit`, before anything is recorded)
only while fewer than `slots + queue` (ACS_MAX_QUEUED_STARTS) user starts are booting or waiting
here; past that it is refused at once with 503 `start_queue_full` and a Retry-After from the
recent boot times, never left to time out. Warm pool members booting ahead of demand take a
free slot only when no user start waits; claims from the pool never pass here. The bound is per
replica (each counts its own starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator

from controlplane.config import ServiceConfig
from controlplane.errors import QuotaExceeded

FIRST_BOOT_GUESS = 5.0  # seconds a boot is taken to last before one was seen here
STARTS_PER_CPU = 2  # the derived bound: agent boots are CPU-bound, two per core keep it busy
QUEUE_PER_SLOT = 25  # the derived queue: ~25 boots' time of waiting per slot


class StartQueueFull(QuotaExceeded):
    """This replica already has as many starts booting and waiting as it takes: retry later."""

    code = "start_queue_full"
    status = 503


class Ticket:
    """One start's place, from its admission until its boot has ended. `user`: someone waits
    on it at the API (served before the pool's); `counted` against the queue's bound."""

    def __init__(self, gate: StartGate, *, user: bool, counted: bool = False) -> None:
        self._gate = gate
        self.user = user
        self.counted = counted
        self.released = False

    def release(self) -> None:
        """The start will not happen after all (nothing created) or has ended: idempotent."""
        if not self.released:
            self.released = True
            self._gate._forget(self)


class StartGate:
    """A first-come bound on concurrent boots, user starts before the pool's."""

    def __init__(self, slots: int | None, queue: int | None) -> None:
        """`slots`: boots at once (None: no bound); `queue`: user starts that may wait
        beyond them (None: no bound)."""
        self.slots = slots
        self.queue = queue
        self._booting = 0
        self._admitted_users = 0  # user tickets not yet released: waiting or booting
        self._waiting: dict[bool, deque[asyncio.Future[None]]] = {True: deque(), False: deque()}
        self._boot_seconds = FIRST_BOOT_GUESS

    @classmethod
    def of(cls, config: ServiceConfig, *, boots_here: bool) -> StartGate:
        """`boots_here`: the runtime boots sandboxes on this host (drivers.runtime.Runtime)."""
        return cls(*bounds(config, boots_here=boots_here))

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @property
    def booting(self) -> int:
        return self._booting

    def admit(self, count: int = 1) -> list[Ticket]:
        """Places for `count` new user starts, or StartQueueFull (all or none). Synchronous,
        so that concurrent requests cannot all pass one look at the queue."""
        full = self.slots is not None and self.queue is not None
        if full and self._admitted_users + count > (self.slots or 0) + (self.queue or 0):
            raise StartQueueFull(
                f"this server already has {self._admitted_users} sandbox starts booting or "
                f"waiting for their turn ({self.slots} boot at once, "
                f"ACS_MAX_CONCURRENT_STARTS; {self.queue} may wait, "
                "ACS_MAX_QUEUED_STARTS); retry later",
                retry_after=self.expected_wait(),
            )
        self._admitted_users += count
        return [Ticket(self, user=True, counted=True) for _ in range(count)]

    @contextlib.contextmanager
    def admitted(self, count: int = 1) -> Iterator[list[Ticket]]:
        """`admit(count)` for a body that records the starts: their places are given back if
        it raises (nothing was launched)."""
        tickets = self.admit(count)
        try:
            yield tickets
        except BaseException:
            for ticket in tickets:
                ticket.release()
            raise

    def place(self, *, user: bool) -> Ticket:
        """A place never refused: a start taken over from a replica that died (`user`), a
        warm pool member (not `user`: it boots only when no user start waits)."""
        return Ticket(self, user=user)

    @contextlib.asynccontextmanager
    async def turn(self, ticket: Ticket) -> AsyncIterator[None]:
        """Wait for a boot slot (in order, user starts first), hold it while the body runs,
        then release the ticket."""
        try:
            if self.slots is not None and (self._booting >= self.slots or self._ahead(ticket)):
                waiter = asyncio.get_running_loop().create_future()
                queue = self._waiting[ticket.user]
                queue.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._booting -= 1  # handed a slot as it was cancelled: pass it on
                        self._wake()
                    else:  # still queued, unless a wake skipped it once it was cancelled
                        with contextlib.suppress(ValueError):
                            queue.remove(waiter)
                    raise
            else:
                self._booting += 1
            began = time.monotonic()
            try:
                yield
            finally:
                self._booting -= 1
                self._learn(time.monotonic() - began)
                self._wake()
        finally:
            ticket.release()

    def _ahead(self, ticket: Ticket) -> bool:
        """Someone waits who goes first."""
        return bool(self._waiting[True]) or (not ticket.user and bool(self._waiting[False]))

    def _wake(self) -> None:
        """Hand free slots to the first waiters (the slot is counted before they resume)."""
        while self.slots is None or self._booting < self.slots:
            queue = self._waiting[True] or self._waiting[False]
            if not queue:
                return
            waiter = queue.popleft()
            if not waiter.done():
                self._booting += 1
                waiter.set_result(None)

    def _forget(self, ticket: Ticket) -> None:
        if ticket.counted:
            self._admitted_users -= 1

    def _learn(self, seconds: float) -> None:
        self._boot_seconds = 0.8 * self._boot_seconds + 0.2 * seconds

    def expected_wait(self) -> int:
        """Seconds until the last start waiting now has its turn (at least 1): the waiters
        ahead, `slots` at a time, each as long as recent boots here."""
        slots = self.slots or 1
        return max(1, math.ceil(self._boot_seconds * max(1, self.waiting) / slots))


def bounds(config: ServiceConfig, *, boots_here: bool) -> tuple[int | None, int | None]:
    """(boots at once, user starts that may wait) on this replica; None: no bound.

    Unset, the boots at once are STARTS_PER_CPU per CPU of this host for a runtime that boots
    sandboxes here (Docker's engine beside the control plane) and unbounded otherwise (a
    cluster's scheduler places pods on many nodes and queues what does not fit); the queue is
    QUEUE_PER_SLOT per slot. The host's share is split among its ACS_WORKERS (each a replica on
    the same host), so that the host boots as many at once whatever their number."""
    slots = config.max_concurrent_starts
    if slots is None:
        per_host = STARTS_PER_CPU * (os.cpu_count() or 1)
        slots = max(1, per_host // config.workers) if boots_here else 0
    if slots == 0:
        return None, None
    queue = config.max_queued_starts
    if queue is None:
        queue = QUEUE_PER_SLOT * slots
    return slots, queue
