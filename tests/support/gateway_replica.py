"""A control plane replica alone in a process, serving the API and the LLM gateway without
sandboxes, for tests that run one where the others are not (a namespace standing for another
machine: tests/support/lan_host.py).

    python -m tests.support.gateway_replica REDIS_URL HOST PORT DATA_DIR

Prints "ready" once serving; logs (JSON) to stderr; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

from controlplane.app import create_app
from controlplane.config import load_config
from tests.support.sandbox_helpers import REPO


async def main(redis_url: str, host: str, port: int, data_dir: Path) -> None:
    config = load_config(
        {},
        redis_url=redis_url,
        data_dir=data_dir,
        spec_dir=REPO / "specs",
        log_format="json",
        rate_limit_per_minute=0,
    )
    runner = web.AppRunner(create_app(config, with_sandboxes=False))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    redis_url, host, port, data_dir = sys.argv[1:5]
    asyncio.run(main(redis_url, host, int(port), Path(data_dir)))
