"""Ending the server processes tests start (redis-server aside: it has its own shutdown)."""

from __future__ import annotations

import subprocess
from typing import Any


def end(process: subprocess.Popen[Any], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout` seconds; waited for."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
