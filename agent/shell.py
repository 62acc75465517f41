"""Running one shell command to completion, with a time limit and capped output (the
``terminal`` tool); :mod:`agent.bash` runs the API's commands."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .config import is_secret_env_name

READ_CHUNK = 64 * 1024


@dataclass
class CommandResult:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool


@dataclass
class _Capture:
    """Bytes read from one pipe, keeping at most ``limit`` of them."""

    limit: int
    data: bytearray
    truncated: bool = False

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data += chunk

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


async def _drain(stream: asyncio.StreamReader, capture: _Capture) -> None:
    # Keep reading past the cap (and discard) so the child never blocks on a full pipe.
    while chunk := await stream.read(READ_CHUNK):
        capture.feed(chunk)


def command_env() -> dict[str, str]:
    """Environment for commands: ours, minus the session API keys."""
    return {k: v for k, v in os.environ.items() if not is_secret_env_name(k)}


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def exit_status(returncode: int | None) -> int:
    """As a shell reports it: 128 + N for a process killed by signal N."""
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def pidfds_available() -> bool:
    """True when this kernel gives pid file descriptors (Linux 5.3+; not every sandbox runtime
    does)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


@contextlib.asynccontextmanager
async def pidfd_child_watcher() -> AsyncIterator[None]:
    """While the server runs, its children's exits are watched through pid file descriptors on
    its own loop. Python 3.11's default (ThreadedChildWatcher) starts a thread per command to
    wait for it, CPU that every command paid (about 0.15 ms of 3 here); 3.12 and later use pidfds
    by themselves. Where pidfds are missing, the default stays."""
    if sys.version_info >= (3, 12) or not pidfds_available():
        yield
        return
    with warnings.catch_warnings():  # the watcher API is deprecated from 3.12 (not used there)
        warnings.simplefilter("ignore", DeprecationWarning)
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            # Closes ours; the next use makes the default again.
            asyncio.set_child_watcher(None)  # type: ignore[arg-type]


class ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Stream protocol that also reports when the process itself exits.

    ``Process.wait()`` only returns once the pipes are closed too, which a
    background job (``sleep 100 &``) can delay for as long as it lives.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=READ_CHUNK, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def run_command(
    command: str,
    cwd: Path,
    time_limit: float,
    *,
    max_output_bytes: int,
    post_exit_grace: float = 1.0,
    extra_env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run ``bash -c command`` in ``cwd`` in its own process group.

    After ``time_limit`` seconds the whole process group is killed and ``exit_code`` is None.
    Each of stdout/stderr keeps at most ``max_output_bytes`` bytes. Once bash
    has exited, output is read for at most ``post_exit_grace`` more seconds,
    so a background job holding the pipes open does not block the answer
    (the job keeps running; its later output is discarded). ``extra_env`` is
    added to :func:`command_env` (e.g. a conversation's secrets).
    """
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: ExitAwareProtocol(loop),
        "bash",
        "-c",
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**command_env(), **(extra_env or {})},
        start_new_session=True,  # own session and process group: killpg reaches everything
    )
    pid = transport.get_pid()
    out = _Capture(max_output_bytes, bytearray())
    err = _Capture(max_output_bytes, bytearray())
    assert protocol.stdout is not None
    assert protocol.stderr is not None
    readers = asyncio.gather(_drain(protocol.stdout, out), _drain(protocol.stderr, err))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(protocol.exited), time_limit)
        except TimeoutError:
            timed_out = True
            kill_group(pid)
            await protocol.exited
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(readers), post_exit_grace)
    finally:
        if transport.get_returncode() is None:  # cancelled while running
            kill_group(pid)
        if not readers.done():
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await readers
        transport.close()  # also closes our ends of the pipes
    return CommandResult(
        exit_code=None if timed_out else exit_status(transport.get_returncode()),
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
    )
