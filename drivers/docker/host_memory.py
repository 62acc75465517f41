"""The live half of the host memory guard: admission counts reservations (acs:memory_reserved),
which overcommit the limits; this refuses new sandboxes while the host itself is short of memory,
so a busy host says 429 before the engine or the kernel's OOM killer says anything.

It reads the control plane's own /proc/meminfo, which is the engine's host only when the engine
is local (a unix socket); with a remote engine it never refuses.
"""

from __future__ import annotations

import time
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
CACHE_SECONDS = 1.0


class HostMemory:
    def __init__(self, floor: int, docker_url: str | None, meminfo: Path = MEMINFO) -> None:
        local = docker_url is None or docker_url.startswith("unix://")
        self._floor = floor if local else 0
        self._meminfo = meminfo
        self._read_at = 0.0
        self._available: int | None = None

    def available(self) -> int | None:
        """MemAvailable in bytes (read at most once a second); None when unknown."""
        now = time.monotonic()
        if now - self._read_at >= CACHE_SECONDS:
            self._read_at = now
            self._available = None
            try:
                for line in self._meminfo.read_text().splitlines():
                    if line.startswith("MemAvailable:"):
                        self._available = int(line.split()[1]) * 1024
                        break
            except (OSError, ValueError):
                pass
        return self._available

    def room_for(self, reservation: int) -> bool:
        """False when starting a sandbox reserving `reservation` would leave the host with less
        than the floor (ACS_HOST_MEMORY_FLOOR) available."""
        if self._floor <= 0:
            return True
        available = self.available()
        return available is None or available - reservation >= self._floor
