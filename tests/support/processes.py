"""Ending the servers the tests start as subprocesses (redis-server, haproxy)."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(process: subprocess.Popen[Any], within: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited `within` seconds later; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=within)


def kill(process: subprocess.Popen[Any]) -> None:
    """SIGKILL (no shutdown, no last word to anyone), reaped."""
    process.kill()
    process.wait(timeout=10)
