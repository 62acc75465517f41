"""`controlplane serve` as a real process, for tests that stop it, kill it or restart it: its
stdout and stderr (JSON logs) are collected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import BOOTSTRAP_KEY
from tests.support.sandbox_helpers import REPO

EXIT_WITHIN = 35  # aiohttp's shutdown_timeout in `serve` is 30 s
START_TIMEOUT = 60  # a start on a busy 2-core host; a test that wants a short one sets its own


class Serve:
    """`controlplane serve` in a subprocess; its stdout and stderr (JSON logs) are collected."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def logs(self) -> str:
        return "\n".join(self.lines[-80:])

    async def wait_event(self, event: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not any(e.get("event") == event for e in self.events()):
            assert time.monotonic() < deadline, f"no {event!r} log in {within} s:\n{self.logs()}"
            await asyncio.sleep(0.02)

    async def wait_healthy(self, http: aiohttp.ClientSession, within: float = 60) -> None:
        """/health answers 200 within `within` seconds (a bound, not a wait: a start on a busy
        2-core host, the Kubernetes driver's first list of the cluster included)."""
        deadline = time.monotonic() + within
        while True:
            assert self.process.returncode is None, f"serve exited:\n{self.logs()}"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{self.url}/health") as resp:
                    if resp.status == 200:
                        return
            assert time.monotonic() < deadline, f"/health not 200 in {within} s:\n{self.logs()}"
            await asyncio.sleep(0.05)

    async def terminate(self) -> tuple[int, float]:
        """SIGTERM; returns the exit code and how long the process took to exit."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        return await self.exited(started)

    async def exited(self, since: float) -> tuple[int, float]:
        try:
            code = await asyncio.wait_for(self.process.wait(), EXIT_WITHIN)
        except TimeoutError:
            raise AssertionError(f"serve did not exit in {EXIT_WITHIN} s:\n{self.logs()}") from None
        await self._reader
        return code, time.monotonic() - since

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def serve_env(redis_url: str, prefix: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACS_")}
    env.update(
        {
            "ACS_REDIS_URL": redis_url,
            "ACS_BOOTSTRAP_API_KEY": BOOTSTRAP_KEY,
            "ACS_CONTAINER_PREFIX": prefix,
            "ACS_SPEC_DIR": str(REPO / "specs"),
            "ACS_DATA_DIR": str(data_dir),
            "ACS_LOG_FORMAT": "json",
            "ACS_RECONCILE_INTERVAL": "1",
            "ACS_START_TIMEOUT": str(START_TIMEOUT),
            "ACS_RATE_LIMIT_PER_MINUTE": "0",
        }
    )
    return env


async def launch_serve(port: int, env: dict[str, str]) -> Serve:
    binary = Path(sys.executable).parent / "controlplane"
    process = await asyncio.create_subprocess_exec(
        str(binary),
        *("serve", "--host", "127.0.0.1", "--port", str(port)),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    return Serve(process, port)
