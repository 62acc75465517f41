"""A probe for a secret inside a sandbox, run as the agent user (where a prompt-injected agent's
commands run): every readable file, every process's environment and command line, and the
readable memory of every process (/proc/<pid>/mem through its maps: the agent user may read
its own processes', the agent server's included). The secret reaches the probe reversed and
hex-encoded, so that neither its command line nor its memory holds it as searched; the probe
skips its own memory for the same reason.

    found = await probe_for(container, secret)   # a ProbeReport
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tests.support.sandbox_helpers import exec_as_agent

_PROBE = r"""
import json, os, re, sys
needle = bytes.fromhex(sys.argv[1])[::-1]
me = str(os.getpid())
report = {"found": [], "files": 0, "environ": 0, "cmdline": 0, "mem": {}, "mem_bytes": 0}
skip = ("/proc", "/sys", "/dev")
for root, dirs, files in os.walk("/", topdown=True):
    if root.startswith(skip):
        dirs[:] = []
        continue
    dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)]
    for name in files:
        path = os.path.join(root, name)
        try:
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                data = handle.read(64 * 1024 * 1024)
        except OSError:
            continue
        report["files"] += 1
        if needle in data:
            report["found"].append("file " + path)
for pid in [p for p in os.listdir("/proc") if p.isdigit() and p != me]:
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        report[part] += 1
        if needle in data:
            report["found"].append(f"{part} {pid}")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    scanned = 0
    with mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            scanned += len(data)
            if needle in data:
                report["found"].append(f"mem {pid} {command}")
                break
    report["mem"][pid] = command
    report["mem_bytes"] += scanned
print(json.dumps(report))
"""


@dataclass(frozen=True)
class ProbeReport:
    found: list[str]
    files: int
    environ: int
    cmdline: int
    mem: dict[str, str]
    """pid -> command line of every process whose memory the probe read."""
    mem_bytes: int

    def read_memory_of(self, fragment: str) -> bool:
        return any(fragment in command for command in self.mem.values())


async def probe_for(container: Any, secret: str) -> ProbeReport:
    """Search the sandbox as the agent user for `secret` (off the event loop)."""
    code, out = await asyncio.to_thread(
        exec_as_agent, container, "python3", "-c", _PROBE, secret.encode()[::-1].hex()
    )
    assert code == 0, out
    data = json.loads(out.splitlines()[-1])
    return ProbeReport(**data)
