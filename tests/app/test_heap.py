"""The served process keeps its start-up heap out of the garbage collector's full collections
(controlplane/heap.py): a full collection that walked it stopped the event loop for 60-130 ms,
the events path's p99 (bench/README.md, `events_rate.py`, run J)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.support.live_server import free_port
from tests.support.serve_process import launch_serve, serve_env

FREEZE_AND_COUNT = """
import gc
from controlplane.app import create_app  # the served process's imports
from controlplane.heap import freeze_startup_heap
frozen = freeze_startup_heap()
print(frozen, gc.get_freeze_count(), len(gc.get_objects()))
"""


def test_freeze_leaves_the_collector_little_to_walk() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FREEZE_AND_COUNT], capture_output=True, text=True, check=True
    ).stdout.split()
    frozen, freeze_count, walked = (int(n) for n in out[-3:])
    assert frozen == freeze_count
    assert frozen > 50_000, "the app's imports were frozen"
    # What a full collection still walks: what was made after the freeze (next to nothing).
    assert walked < frozen // 20, (walked, frozen)


async def test_serve_freezes_its_heap_once_started_before_serving(
    redis_url: str, test_prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    env = serve_env(redis_url, test_prefix, tmp_path / "data")
    env["ACS_WARM_POOL"] = "0"
    env["ACS_LOG_LEVEL"] = "info"
    server = await launch_serve(port, env)
    try:
        await server.wait_event("serving", within=60)
        events = [e.get("event") for e in server.events()]
        assert events.index("startup_heap_frozen") < events.index("serving")
        frozen = next(e for e in server.events() if e.get("event") == "startup_heap_frozen")
        # After start-up (the app, its services and the listeners' set-up), not before.
        assert frozen["objects"] > 50_000, frozen
        async with aiohttp.ClientSession() as http:
            await server.wait_healthy(http)
        code, _took = await server.terminate()
        assert code == 0, server.logs()
    finally:
        await server.kill()
