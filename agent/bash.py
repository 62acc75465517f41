"""Bash commands outside conversations, as the official agent server runs them.

``POST /api/bash/start_bash_command`` starts a command in the background and answers its
``BashCommand``; its output arrives as ``BashOutput`` events (``order`` 0, 1, ...; the last one
carries ``exit_code``, -1 when the command was killed at its timeout), read with
``GET /api/bash/bash_events/search``. ``POST /api/bash/execute_bash_command`` waits and answers
one ``BashOutput`` with all the output, plus our ``timed_out`` and ``truncated``.

Output is flushed as an event every ``FLUSH_BYTES`` or ``FLUSH_SECONDS``, so a poller sees
progress. Events live in memory: each command keeps at most ``max_output_bytes`` per stream
(the rest is read and dropped), and the oldest finished commands are forgotten once the store
holds more than ``MAX_STORED_BYTES`` of output or ``MAX_COMMANDS`` commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .shell import ExitAwareProtocol, command_env, exit_status, kill_group

READ_CHUNK = 64 * 1024
FLUSH_BYTES = 64 * 1024
FLUSH_SECONDS = 0.5
MAX_STORED_BYTES = 16 * 1024 * 1024
MAX_COMMANDS = 500


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class _Stream:
    limit: int
    pending: bytearray = field(default_factory=bytearray)
    kept: int = 0
    truncated: bool = False

    def feed(self, chunk: bytes) -> None:
        room = self.limit - self.kept
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.pending += chunk
        self.kept += len(chunk)

    def take(self) -> str | None:
        if not self.pending:
            return None
        # Keep an incomplete UTF-8 sequence for the next chunk rather than mangling it.
        cut = len(self.pending)
        for back in range(1, min(4, cut) + 1):
            byte = self.pending[cut - back]
            if byte & 0xC0 != 0x80:  # the start of the last character
                size = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
                if size > back:
                    cut -= back
                break
        value = bytes(self.pending[:cut]).decode("utf-8", errors="replace")
        del self.pending[:cut]
        return value or None

    def rest(self) -> str | None:
        value = bytes(self.pending).decode("utf-8", errors="replace") if self.pending else None
        self.pending.clear()
        return value


@dataclass
class Command:
    event: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    process_group: int | None = None
    stop_requested: bool = False
    size: int = 0
    timed_out: bool = False
    truncated: bool = False

    @property
    def id(self) -> str:
        return str(self.event["id"])


class BashService:
    def __init__(self, max_output_bytes: int, post_exit_grace: float) -> None:
        self.max_output_bytes = max_output_bytes
        self.post_exit_grace = post_exit_grace
        self.commands: dict[str, Command] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- reading ------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """Every stored event, oldest first."""
        out: list[dict[str, Any]] = []
        for command in self.commands.values():
            out.append(command.event)
            out.extend(command.outputs)
        out.sort(key=lambda e: str(e["timestamp"]))
        return out

    def find(self, event_id: str) -> dict[str, Any] | None:
        wanted = event_id.replace("-", "").lower()
        for command in self.commands.values():
            if command.id == wanted:
                return command.event
            for output in command.outputs:
                if output["id"] == wanted:
                    return output
        return None

    # --- running ------------------------------------------------------------------

    def start(self, command: str, cwd: Path, timeout: float) -> Command:
        event = {
            "id": uuid.uuid4().hex,
            "timestamp": _now(),
            "kind": "BashCommand",
            "command": command,
            "cwd": str(cwd),
            "timeout": timeout,
        }
        record = Command(event)
        self.commands[record.id] = record
        self._forget_old()
        task = asyncio.create_task(self._run(record, cwd, timeout), name=f"bash:{record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return record

    def stop(self, command_id: str) -> bool | None:
        """True: signalled; False: already finished; None: unknown id."""
        record = self.commands.get(command_id.replace("-", "").lower())
        if record is None:
            return None
        if record.done.is_set():
            return False
        record.stop_requested = True  # a stop racing the spawn is applied once it exists
        if record.process_group is not None:
            kill_group(record.process_group)
        return True

    def _output(
        self,
        record: Command,
        stdout: str | None,
        stderr: str | None,
        exit_code: int | None = None,
    ) -> None:
        event = {
            "id": uuid.uuid4().hex,
            "timestamp": _now(),
            "kind": "BashOutput",
            "command_id": record.id,
            "order": len(record.outputs),
            "exit_code": exit_code,
            "stdout": stdout,
            "stderr": stderr,
        }
        record.size += len(stdout or "") + len(stderr or "")
        record.outputs.append(event)

    async def _run(self, record: Command, cwd: Path, timeout: float) -> None:
        try:
            exit_code = await self._execute(record, cwd, timeout)
        except (OSError, ValueError) as exc:
            # ValueError: a command exec cannot take (a NUL byte, a lone surrogate), which
            # both readings of the body accept as a string: said, as a spawn's failure is.
            self._output(record, None, f"Error executing command: {exc}", exit_code=-1)
        else:
            if exit_code is None:  # cancelled: the server is stopping
                return
        finally:
            record.done.set()
            record.process_group = None
            self._forget_old()

    async def _execute(self, record: Command, cwd: Path, timeout: float) -> int | None:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: ExitAwareProtocol(loop),
            "bash",
            "-c",
            str(record.event["command"]),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=command_env(),
            start_new_session=True,
        )
        record.process_group = transport.get_pid()
        if record.stop_requested:
            kill_group(record.process_group)
        out, err = _Stream(self.max_output_bytes), _Stream(self.max_output_bytes)

        def flush(force: bool = False) -> None:
            size = len(out.pending) + len(err.pending)
            if size and (force or size >= FLUSH_BYTES):
                stdout, stderr = out.take(), err.take()
                if stdout or stderr:
                    self._output(record, stdout, stderr)

        async def drain(reader: asyncio.StreamReader, stream: _Stream) -> None:
            while chunk := await reader.read(READ_CHUNK):
                stream.feed(chunk)
                flush()

        async def ticker() -> None:
            while True:
                await asyncio.sleep(FLUSH_SECONDS)
                flush(force=True)

        assert protocol.stdout is not None
        assert protocol.stderr is not None
        readers = asyncio.gather(drain(protocol.stdout, out), drain(protocol.stderr, err))
        tick = asyncio.create_task(ticker())
        try:
            try:
                await asyncio.wait_for(asyncio.shield(protocol.exited), timeout)
            except TimeoutError:
                record.timed_out = True
                kill_group(transport.get_pid())
                await protocol.exited
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(readers), self.post_exit_grace)
        except asyncio.CancelledError:
            kill_group(transport.get_pid())
            return None
        finally:
            tick.cancel()
            if not readers.done():
                readers.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await readers
            transport.close()
        record.truncated = out.truncated or err.truncated
        exit_code = -1 if record.timed_out else exit_status(transport.get_returncode())
        self._output(record, out.rest(), err.rest(), exit_code=exit_code)
        return exit_code

    def _forget_old(self) -> None:
        """Drop the oldest finished commands while the store is over its bounds."""
        while len(self.commands) > MAX_COMMANDS or (
            sum(c.size for c in self.commands.values()) > MAX_STORED_BYTES
        ):
            oldest = next((c for c in self.commands.values() if c.done.is_set()), None)
            if oldest is None:
                return
            del self.commands[oldest.id]

    def clear(self) -> int:
        """Forget every finished command; the number of events forgotten."""
        finished = [c for c in self.commands.values() if c.done.is_set()]
        for command in finished:
            del self.commands[command.id]
        return sum(1 + len(c.outputs) for c in finished)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
