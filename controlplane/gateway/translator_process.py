"""Starts the translator (translator.py) when the gateway first needs it, and again if it died;
stops it with the control plane. Deployments that never call a translated provider never pay
for it (~160 MB, ~4.6 s of CPU to import LiteLLM).

Its environment is made, not inherited: LiteLLM reads provider keys and cloud credentials from
the environment (OPENAI_API_KEY, AWS_*, GOOGLE_APPLICATION_CREDENTIALS, ...) and from files
under HOME, and would send them to a user's `llm_base_url` when a call brings no key. So the
translator gets PATH, a HOME and TMPDIR of its own (empty, in the gateway's private directory),
the locale, what makes Python find its packages and TLS its certificates, and its one setting;
none of the control plane's ACS_* variables, no key, no credential, no proxy."""

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
INHERITED = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "PYTHONPATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
"""What the translator takes from the control plane's environment: nothing that names a
provider, a key or a credential."""


def translator_env(directory: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The translator's whole environment (its HOME and TMPDIR made under `directory`)."""
    source = os.environ if environ is None else environ
    home, tmp = directory / "home", directory / "tmp"
    home.mkdir(mode=0o700, exist_ok=True)
    tmp.mkdir(mode=0o700, exist_ok=True)
    env = {name: source[name] for name in INHERITED if name in source}
    env.setdefault("PATH", os.defpath)
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        # No network at import: LiteLLM would otherwise fetch its price list (and retry offline).
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        # No ambient cloud credentials: boto3's chain would ask the instance metadata service
        # (through sockets the guarded event loop never sees) and sign with the host's role.
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        GOOGLE_APPLICATION_CREDENTIALS=os.devnull,
        NO_GCE_CHECK="True",
        # Its memory limit is on address space (RLIMIT_AS): glibc would reserve 64 MiB of it
        # per thread that allocates (up to 8 per core) without using it; two arenas are enough
        # for one event loop and LiteLLM's logging threads.
        MALLOC_ARENA_MAX="2",
    )
    return env


class TranslatorUnavailable(Exception):
    pass


class TranslatorProcess:
    def __init__(self, directory: Path, memory_limit: int = 0) -> None:
        """`memory_limit`: the process's address space in bytes (RLIMIT_AS, set by the
        translator on itself before it imports LiteLLM); 0: none."""
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._memory_limit = memory_limit
        self.socket_path = str(directory / f"llm-translator-{os.getpid()}.sock")
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Future[None] | None = None
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
        """Running and answering, started if need be. Raises TranslatorUnavailable.

        Every call that comes while a start is under way waits for that start (within its
        START_TIMEOUT) and shares its outcome: the process runs from its spawn, but answers
        only once LiteLLM is imported (seconds, a minute on a loaded host), and a burst of calls
        sent to its socket meanwhile failed as `upstream_unreachable` (issue 30: 127 of 128
        calls at once). A failed start is not made again by each of its waiters: the next call
        after it starts anew. A waiter that goes away does not cancel the start for the others.
        """
        starting = self._starting
        if starting is None or starting.done():
            if self.running:
                return
            if self._proc is not None:
                # Died since its last call: a crash, or an allocation past its memory limit.
                log.warning(
                    "llm_translator_exited",
                    pid=self._proc.pid,
                    returncode=self._proc.returncode,
                    memory_limit=self._memory_limit,
                )
            starting = self._starting = asyncio.ensure_future(self._start())
            # Its failure is each waiter's to raise; retrieved here too, for when none is left.
            starting.add_done_callback(lambda f: f.cancelled() or f.exception())
        await asyncio.shield(starting)

    def command(self) -> list[str]:
        """The translator's command line (its environment: translator_env)."""
        return [
            sys.executable,
            "-m",
            "controlplane.gateway.translator",
            "--socket",
            self.socket_path,
            "--memory-limit",
            str(self._memory_limit),
        ]

    def exit_status(self) -> int | None:
        """The process's exit status once it has exited (None: running, or never started)."""
        return None if self._proc is None else self._proc.returncode

    async def _start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        started = time.monotonic()
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(),
            env=translator_env(self._directory),
            stdin=asyncio.subprocess.DEVNULL,
        )
        await self.until_ready(started, self._proc.pid)

    async def until_ready(self, started: float, pid: int) -> None:
        """Waits for the process started at `started` to answer /health; raises
        TranslatorUnavailable (and closes) if it exits or does not answer in START_TIMEOUT."""
        deadline = started + START_TIMEOUT
        while time.monotonic() < deadline:
            if (status := self.exit_status()) is not None:
                raise TranslatorUnavailable(
                    f"the LLM translator exited with {status} while starting"
                )
            if await asyncio.to_thread(os.path.exists, self.socket_path):
                try:
                    async with self.session.get(
                        "http://translator/health", timeout=aiohttp.ClientTimeout(total=2)
                    ) as resp:
                        if resp.status == 200:
                            log.info(
                                "llm_translator_started",
                                pid=pid,
                                seconds=round(time.monotonic() - started, 2),
                            )
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
            await asyncio.sleep(0.1)
        await self.close()
        raise TranslatorUnavailable(f"the LLM translator did not start within {START_TIMEOUT} s")

    async def close(self) -> None:
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done() and starting is not asyncio.current_task():
            starting.cancel()
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
