"""One Docker engine, called without blocking the event loop: the docker SDK's blocking calls run
in two thread pools (lanes) owned here, each its own FIFO, so that quick calls (inspect, pause,
unpause, image look-up, list) never queue behind slow ones (create and start, remove,
networks), which hold a thread for up to seconds each."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import structlog
from docker.errors import APIError, DockerException, NotFound
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from drivers.errors import RuntimeUnavailable

log = structlog.get_logger(__name__)
T = TypeVar("T")

QUICK = "quick"
SLOW = "slow"


class DockerEngine:
    """`threads` bounds concurrent slow engine calls, `quick_threads` the quick ones.

    `on_error(operation)`, if given, is called on the event loop for every engine call that
    fails (engine unreachable, an error answer, or a DriverError): the error metric's hook.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        threads: int = 8,
        quick_threads: int = 4,
        timeout: int = 60,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._base_url = base_url
        self._on_error = on_error
        self._timeout = timeout
        self._threads = threads + quick_threads
        self._lanes = {
            SLOW: ThreadPoolExecutor(max_workers=threads, thread_name_prefix="docker-slow"),
            QUICK: ThreadPoolExecutor(max_workers=quick_threads, thread_name_prefix="docker-quick"),
        }
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()

    @property
    def local(self) -> bool:
        """The engine runs on this host (a unix socket): its host's memory is ours to read."""
        return self._base_url is None or self._base_url.startswith("unix://")

    def client(self) -> docker.DockerClient:
        """The SDK client (blocking: call it from a lane or a thread of one's own)."""
        # Created lazily, in a worker thread, so start-up works while the engine is down.
        with self._client_lock:
            if self._client is None:
                # Two more connections: the container and the image event streams hold one each.
                pool = self._threads + 2
                kwargs: dict[str, Any] = {"timeout": self._timeout, "max_pool_size": pool}
                if self._base_url:
                    self._client = docker.DockerClient(base_url=self._base_url, **kwargs)
                else:
                    self._client = docker.from_env(**kwargs)
            return self._client

    def report(self, operation: str) -> None:
        """Count a failed engine call (the error metric's hook); never raises."""
        if self._on_error is not None:
            try:
                self._on_error(operation)
            except Exception:
                log.exception("docker_error_hook_failed")

    async def call(
        self, fn: Callable[[docker.DockerClient], T], operation: str = "other", lane: str = QUICK
    ) -> T:
        """Run `fn` in `lane`'s pool; `operation` labels the error metric if it fails. An
        engine that does not answer raises RuntimeUnavailable; its error answers (APIError,
        NotFound) pass through for the caller to map."""
        loop = asyncio.get_running_loop()

        def run() -> T:
            try:
                return fn(self.client())
            except (RequestsConnectionError, ReadTimeout) as exc:
                raise RuntimeUnavailable(f"Docker engine unreachable: {exc}") from None
            except DockerException as exc:
                if isinstance(exc, APIError | NotFound):
                    raise
                raise RuntimeUnavailable(f"Docker engine unreachable: {exc}") from None

        future = loop.run_in_executor(self._lanes[lane], run)
        try:
            return await asyncio.shield(future)
        except Exception:
            self.report(operation)
            raise
        except asyncio.CancelledError:
            # The engine call cannot be interrupted. Let it finish before the cancellation goes
            # on, so that whoever cancelled (a delete cancelling a launch) acts after its effect:
            # otherwise the delete's removal can run before the container or volume exists,
            # leaking it. Cancellations repeated meanwhile (a close that cancels until a task
            # ends) wait too.
            while not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([future])
            raise

    async def close(self) -> None:
        client = self._client
        if client is not None:
            await asyncio.get_running_loop().run_in_executor(self._lanes[QUICK], client.close)
        for pool in self._lanes.values():
            pool.shutdown(wait=False, cancel_futures=True)
