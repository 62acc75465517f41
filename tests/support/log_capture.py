"""Capture the app's structlog output (as configured by controlplane.logging) in a test."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from controlplane.logging import configure_logging


class LogCapture:
    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def records(self) -> list[dict[str, Any]]:
        """Every JSON line written so far, parsed."""
        return [json.loads(line) for line in self.text.splitlines() if line.strip()]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == name]


@contextmanager
def capture_logs(level: str = "debug") -> Iterator[LogCapture]:
    """JSON logs into a StringIO through the real configure_logging; restores the old config."""
    previous = structlog.get_config()
    capture = LogCapture()
    configure_logging("json", level, stream=capture.stream)
    try:
        yield capture
    finally:
        structlog.configure(**previous)
