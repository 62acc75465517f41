"""Image ids known without asking the engine, for as long as the engine's image events are followed.

Every start looks its spec's image up (to refuse a missing image at once, and so that the warm
pool hands out only members of the current image). Asking the engine costs a few milliseconds
when it is idle and tens when it is busy creating containers. Images change rarely (a build, a
pull, a tag or a removal), and every such change is an image event: so an id is kept while a
thread follows those events, and any event clears them all. While the stream is down nothing is
trusted, and each look-up asks the engine again.

The stream asks for the events since a second before it was opened, so a change made while the
subscription was being set up is replayed rather than lost; a look-up's answer is kept only if no
event (and no reconnect) came while it was being made.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)

RETRY_FIRST, RETRY_MAX = 0.5, 5.0

OpenStream = Callable[[int], Any]
"""Opens the engine's image event stream from a Unix time (seconds): an iterable of events with
close()."""


class ImageIdCache:
    def __init__(self, open_stream: OpenStream) -> None:
        self._open = open_stream
        self._ids: dict[str, str] = {}
        self._generation = 0
        self._live = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stream: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Follow the events from now on (once; later calls do nothing)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=self._follow, name="docker-image-events", daemon=True
            )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._live = False
            self._ids.clear()
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def get(self, image: str) -> str | None:
        """The id last looked up, while it can be trusted; None means: ask the engine."""
        with self._lock:
            return self._ids.get(image) if self._live else None

    def generation(self) -> int:
        """Take before asking the engine, pass to `put` with its answer."""
        with self._lock:
            return self._generation

    def put(self, image: str, image_id: str | None, generation: int) -> None:
        with self._lock:
            if image_id is None:
                self._ids.pop(image, None)
            elif self._live and generation == self._generation:
                self._ids[image] = image_id

    def _changed(self, live: bool) -> None:
        with self._lock:
            self._ids.clear()
            self._generation += 1
            self._live = live and not self._stop.is_set()

    def _follow(self) -> None:
        delay = RETRY_FIRST
        while not self._stop.is_set():
            since = int(time.time()) - 1
            try:
                stream = self._open(since)
                with self._lock:
                    self._stream = stream
                if self._stop.is_set():
                    stream.close()
                    break
                self._changed(live=True)
                delay = RETRY_FIRST
                for _event in stream:
                    self._changed(live=True)
            except Exception as exc:
                if not self._stop.is_set():
                    log.warning("docker_image_events_broke", error=str(exc))
            self._changed(live=False)
            self._stop.wait(delay)
            delay = min(delay * 2, RETRY_MAX)
