"""The start-up heap kept out of the cyclic garbage collector's full collections.

A served process holds ~110,000 container objects from its imports and start-up (pydantic's
models and schemas, the OpenAPI document, aiohttp, redis-py, the drivers) that live as long as
it does. CPython's full (generation 2) collection walks every one of them each time it runs:
under load it ran every few seconds and stopped the event loop for 60-130 ms each time, which
was the p99 of the events path at 500 events/s while its p50 was 2-4 ms (bench/README.md,
`events_rate.py`, run J). `gc.freeze()` moves what exists once the server is up into a
generation the collector never walks: a full collection then walks only what was made since
(requests, sockets, their queues), and is a few milliseconds. Cycles among the frozen objects
are never collected, which costs nothing for objects that live until exit anyway.
"""

from __future__ import annotations

import gc
import time

import structlog

log = structlog.get_logger(__name__)


def freeze_startup_heap() -> int:
    """Collect once, then freeze everything that survived (call once the process is up, before
    it takes load); the number of objects frozen."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "startup_heap_frozen",
        objects=frozen,
        ms=round((time.perf_counter() - started) * 1000, 1),
    )
    return frozen
