"""The `controlplane` command run the way a shell runs it, or in the test's own process.

A subprocess costs about 1.4 s of CPU (a fresh interpreter importing aiohttp, redis, pydantic
and the settings); the suite ran the command some fifty times, a third of the unit tier's work
outside its workers. `run_in_process` calls `controlplane.cli.main(argv)` in a thread of its own
instead, with what a process would have had of its own: the environment's ACS_* variables (the
test process's own hidden), stdin, stdout and stderr, and the exit status (argparse's
`SystemExit`, and 1 with the traceback on stderr for an exception nothing caught, as the
interpreter does). The thread keeps the test's event loop free to serve the command's requests
to an app in the same process, and starts from an empty context (no context variable of the
test's). `run_process` runs the installed console script: the tests of the entry point itself
and of the exits that happen before any of the command's code keep it.

`serve` gets its signal handlers from the main thread only: in a thread, only its refusals
(bad configuration) can be run.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import os
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import structlog

from controlplane.cli import main

CONTROLPLANE = Path(sys.executable).parent / "controlplane"
"""The console script pip installed into this venv."""
STREAMS = ("stdin", "stdout", "stderr")


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def environment(**values: str | Path) -> dict[str, str]:
    """The test process's environment without any ACS_* variable, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACS_")}
    env.update({k: str(v) for k, v in values.items()})
    return env


async def run_process(*args: str, env: Mapping[str, str], stdin: bytes = b"") -> Result:
    """`controlplane ARGS` as a subprocess with `env` as its whole environment."""
    proc = await asyncio.create_subprocess_exec(
        str(CONTROLPLANE),
        *args,
        env=dict(env),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


_own = threading.local()
"""The streams of the command running in this thread, if one is."""


class _ThreadStream:
    """sys.stdin, sys.stdout or sys.stderr while a command runs: the command's thread reads and
    writes its own, every other thread (the event loop serving the command, an app's logs)
    the process's."""

    def __init__(self, name: str, process: TextIO) -> None:
        self._name = name
        self._process = process

    def _stream(self) -> TextIO:
        own: TextIO | None = getattr(_own, self._name, None)
        return own if own is not None else self._process

    def write(self, text: str) -> int:
        return self._stream().write(text)

    def flush(self) -> None:
        self._stream().flush()

    def readline(self, size: int | None = -1) -> str:
        return self._stream().readline(-1 if size is None else size)

    def isatty(self) -> bool:
        return self._stream().isatty()

    def fileno(self) -> int:
        return self._stream().fileno()


@contextmanager
def _process_state(env: Mapping[str, str]) -> Iterator[None]:
    """The command's environment and streams for as long as it runs; the test process's own,
    and its logging configuration (the command configures structlog for itself), after."""
    saved_env = dict(os.environ)
    saved_streams = {name: getattr(sys, name) for name in STREAMS}
    saved_logging = structlog.get_config()
    for name in [name for name in os.environ if name.startswith("ACS_")]:
        del os.environ[name]
    os.environ.update(env)
    for name, stream in saved_streams.items():
        setattr(sys, name, _ThreadStream(name, stream))
    try:
        yield
    finally:
        for name, stream in saved_streams.items():
            setattr(sys, name, stream)
        os.environ.clear()
        os.environ.update(saved_env)
        structlog.configure(**saved_logging)


def _exit_status(exc: SystemExit, err: TextIO) -> int:
    """What the interpreter makes of a SystemExit (argparse's usage errors raise one)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=err)
    return 1


async def run_in_process(
    *args: str, env: Mapping[str, str] | None = None, stdin: str | TextIO = ""
) -> Result:
    """`controlplane ARGS` in a thread of this process: `env` its ACS_* variables, `stdin` a
    text or a stream (a terminal: `open(pty_slave)`)."""
    out, err = io.StringIO(), io.StringIO()
    own_stdin = io.StringIO(stdin) if isinstance(stdin, str) else stdin
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def command() -> int:
        _own.stdin, _own.stdout, _own.stderr = own_stdin, out, err
        try:
            return main(list(args))
        except SystemExit as exc:
            return _exit_status(exc, err)
        except BaseException:
            traceback.print_exc(file=err)
            return 1
        finally:
            _own.stdin = _own.stdout = _own.stderr = None

    def thread() -> None:
        code = contextvars.Context().run(command)
        loop.call_soon_threadsafe(done.set_result, code)

    with _process_state(env or {}):
        threading.Thread(target=thread, name="controlplane-cli", daemon=True).start()
        code = await done
    return Result(code, out.getvalue(), err.getvalue())
