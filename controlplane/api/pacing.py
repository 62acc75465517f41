"""Pacing of unauthenticated requests (docs/security.md, "Unauthenticated traffic").

A refusal costs little on its own (no body is read, no Redis call for a missing or malformed
key), but a flood of them still takes turns on the event loop with the requests that matter: each
await of an authenticated request waits behind every refusal that became ready meanwhile. So all
requests that end without a principal share one budget per process (GCRA: `rate` per second,
bursts of `burst`). Past it, the answer waits for its slot. A flooding client that waits for its
answers (as HTTP clients do) is slowed to the budget; one that does not gets its answer at once
once the wait would pass `max_delay`, since holding more connections would cost more than
answering.
"""

from __future__ import annotations

import time


class Pacer:
    def __init__(self, rate: float, burst: int, max_delay: float = 10.0) -> None:
        self._interval = 1.0 / rate
        self._tolerance = burst * self._interval
        self._max_delay = max_delay
        self._tat = 0.0  # the theoretical arrival time of the next request

    def delay(self) -> float:
        """Seconds this request must wait for its slot (0 within the budget); takes the slot."""
        now = time.monotonic()
        tat = max(self._tat, now)
        wait = tat - self._tolerance - now
        if wait > self._max_delay:
            return 0.0  # shed: answer at once rather than hold yet another connection
        self._tat = tat + self._interval
        return max(0.0, wait)
