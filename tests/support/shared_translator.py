"""One LLM translator per pytest-xdist worker, for the tests that call a translated provider
without testing the translator itself.

Each start of the translator imports LiteLLM: about 7 to 9 s of CPU, which every app of every
such test paid again. The worker's process (`WorkerTranslator`) is started with the product's
command line and environment (TranslatorProcess.command, translator_env) on the first call that
needs it and stopped when the worker ends. Each test's app gets a `SharedTranslator` (through
create_app's `translator`) whose HTTP session belongs to the test's event loop, which the app
does not stop. The tests of the translator's own life (its start, environment, memory cap,
crash and restart, credentials: tests/security/test_translator.py,
tests/gateway/test_translator_memory.py) keep a translator of their own app.

The tests that use it are one xdist group (tests/conftest.py, GROUPS_BY_FIXTURE): one worker
runs them all, so one process serves them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.gateway.translator_process import TranslatorProcess, translator_env
from tests.support.processes import WORKER_TRANSLATORS, stop


class WorkerTranslator:
    """The worker's translator process, started on demand, stopped with the worker."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, command: list[str], socket_path: str) -> int:
        """Starts the process (again, if it died); its pid."""
        self.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        self.process = subprocess.Popen(
            command, env=translator_env(self.directory), stdin=subprocess.DEVNULL
        )
        WORKER_TRANSLATORS.add(self.process.pid)
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                stop(self.process)
            else:
                self.process.wait()
            WORKER_TRANSLATORS.discard(self.process.pid)
        self.process = None


class SharedTranslator(TranslatorProcess):
    """A test app's handle on the worker's translator: started if need be, never stopped."""

    def __init__(self, worker: WorkerTranslator) -> None:
        super().__init__(worker.directory)
        self.socket_path = str(worker.directory / "llm-translator.sock")
        self._worker = worker

    @property
    def running(self) -> bool:
        return self.exit_status() is None and self._worker.process is not None

    def exit_status(self) -> int | None:
        process = self._worker.process
        return None if process is None else process.poll()

    async def _start(self) -> None:
        started = time.monotonic()
        pid = self._worker.spawn(self.command(), self.socket_path)
        await self.until_ready(started, pid)

    async def close(self) -> None:
        """The session of this test's event loop only: the process is the worker's."""
        if self._session is not None:
            await self._session.close()
            self._session = None


@pytest.fixture(scope="session")
def worker_translator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerTranslator]:
    # A short private directory: the socket's path must fit AF_UNIX's 108 bytes.
    directory = tmp_path_factory.mktemp("llm")
    directory.chmod(0o700)
    worker = WorkerTranslator(directory)
    yield worker
    worker.stop()


@pytest.fixture
async def shared_translator(
    worker_translator: WorkerTranslator,
) -> AsyncIterator[TranslatorProcess]:
    """The worker's translator, for the apps of this test (create_app's `translator`)."""
    translator = SharedTranslator(worker_translator)
    yield translator
    await translator.close()
