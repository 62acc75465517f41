"""The event loop `controlplane serve` runs on (ACS_EVENT_LOOP).

uvloop by default: libuv's loop, written in Cython, does the same work as the standard
library's with fewer system calls and less Python per wake-up; measured here, 14-19 % less CPU
a gateway call and ~N % a pool claim (bench/README.md). The service uses no loop API uvloop
lacks; `asyncio` keeps the standard library's loop (for a platform without uvloop's wheels, or
to rule it out). The commands other than `serve` run briefly and keep the standard loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def run_loop(kind: Literal["uvloop", "asyncio"], main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a new loop of `kind`, as asyncio.run() does."""
    if kind == "uvloop":
        import uvloop  # noqa: PLC0415 - only here: the other commands never load it

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
