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

REPORT_SECONDS = 10.0


class Pacer:
    def __init__(self, rate: float, burst: int, max_delay: float = 10.0) -> None:
        self.rate = rate
        self._interval = 1.0 / rate
        self._tolerance = burst * self._interval
        self._max_delay = max_delay
        self._tat = 0.0  # the theoretical arrival time of the next request
        self._paced = 0
        self._reported = -REPORT_SECONDS  # the first paced request is reported at once

    def count_paced(self) -> int | None:
        """Count one paced request. A flood's requests get no log line each (that would be a
        flood of its own): at the first, then every REPORT_SECONDS, this returns how many there
        were since the last time, for one summary line; otherwise None."""
        self._paced += 1
        now = time.monotonic()
        if now - self._reported < REPORT_SECONDS:
            return None
        count, self._paced, self._reported = self._paced, 0, now
        return count

    def delay(self) -> float:
        """Seconds this request must wait for its slot (0 within the budget); takes the slot."""
        now = time.monotonic()
        tat = max(self._tat, now)
        wait = tat - self._tolerance - now
        if wait > self._max_delay:
            return 0.0  # shed: answer at once rather than hold yet another connection
        self._tat = tat + self._interval
        return max(0.0, wait)
