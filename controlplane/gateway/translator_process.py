"""Starts the translator (translator.py) when the gateway first needs it, and again if it died;
stops it with the control plane. Deployments that never call a translated provider never pay
for it (~160 MB, ~4.6 s of CPU to import LiteLLM)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import aiohttp
import structlog

log = structlog.get_logger(__name__)

START_TIMEOUT = 90.0
"""LiteLLM's import takes ~5 s on a quiet host, far longer on a loaded one."""


class TranslatorUnavailable(Exception):
    pass


class TranslatorProcess:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.socket_path = str(directory / f"llm-translator-{os.getpid()}.sock")
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.UnixConnector(path=self.socket_path, limit=0)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def ensure(self) -> None:
        """Running and answering, started if need be. Raises TranslatorUnavailable."""
        if self.running:
            return
        async with self._lock:
            if self.running:
                return
            await self._start()

    async def _start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
        started = time.monotonic()
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controlplane.gateway.translator",
            "--socket",
            self.socket_path,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
        )
        deadline = started + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                raise TranslatorUnavailable(
                    f"the LLM translator exited with {self._proc.returncode} while starting"
                )
            if await asyncio.to_thread(os.path.exists, self.socket_path):
                try:
                    async with self.session.get(
                        "http://translator/health", timeout=aiohttp.ClientTimeout(total=2)
                    ) as resp:
                        if resp.status == 200:
                            log.info(
                                "llm_translator_started",
                                pid=self._proc.pid,
                                seconds=round(time.monotonic() - started, 2),
                            )
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
            await asyncio.sleep(0.1)
        await self.close()
        raise TranslatorUnavailable(f"the LLM translator did not start within {START_TIMEOUT} s")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
