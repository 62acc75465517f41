"""Ending the servers the tests start as subprocesses (redis-server, haproxy), and finding the
children the control plane starts in the test's process (the LLM translator)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
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


WORKER_TRANSLATORS: set[int] = set()
"""The translator tests/support/shared_translator.py started for this worker: no test's app
owns it, and translators() leaves it out."""


def translators() -> list[int]:
    """The LLM translators this process started (a control plane served in the test's process
    starts its own), but the worker's shared one."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if int(entry.name) in WORKER_TRANSLATORS:
            continue
        if ppid == os.getpid() and b"controlplane.gateway.translator" in cmdline:
            found.append(int(entry.name))
    return found
