"""The event loop `controlplane serve` runs on (ACS_EVENT_LOOP).

The standard library's by default. uvloop (libuv's loop, in Cython) does the same work with
less CPU: 14-19 % less a gateway call here (bench/README.md). It is a choice, not the default:
its loop's close waits for every request libuv still holds, and the test suite run on it once
hung there for good in a test's teardown (the trigger not found); a server must exit at
SIGTERM. The commands other than `serve` keep the standard loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def run_loop(kind: Literal["asyncio", "uvloop"], main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a new loop of `kind`, as asyncio.run() does."""
    if kind == "uvloop":
        import uvloop  # noqa: PLC0415 - only here: the other commands never load it

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
