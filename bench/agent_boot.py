"""Agent server boot time and idle memory of sandbox images, raw Docker only, images interleaved.

Run: `.venv/bin/python -m bench.agent_boot --image acs-sandbox-default:old --image
acs-sandbox-default:latest [--runs 10]`. bench/README.md says what it measures and how.

For each run and each image (the order alternates per run, so background load hits both alike):
create a container the way the driver does (no capabilities, no-new-privileges, memory limit, a
loopback-published port Docker picks), start it, poll `GET /health` every 5 ms until 200 (boot =
first 200 minus the return of `start`; boot CPU = the container's cgroup CPU at that moment:
tini and the agent server, far less moved by the host's load than the wall time), wait
`--settle` seconds, then read the agent server's VmRSS from /proc inside the container (the
largest process whose command line holds the image's command; tini is far smaller). Every
container carries the run's label and is removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import shlex
import statistics
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from bench.common import percentile

HEALTH_POLL = 0.005
BOOT_TIMEOUT = 120.0
PORT = 8000


@dataclass
class Samples:
    boot: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)


def container_cpu(container_id: str) -> float | None:
    """CPU seconds the container's processes have used (its cgroup: v1 with the cgroupfs
    driver, or v2), None where neither is found."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage")
    with contextlib.suppress(OSError, ValueError):
        return int(v1.read_text()) / 1e9
    for v2 in (
        Path(f"/sys/fs/cgroup/docker/{container_id}/cpu.stat"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat"),
    ):
        with contextlib.suppress(OSError, ValueError):
            fields = dict(line.split() for line in v2.read_text().splitlines())
            return int(fields["usage_usec"]) / 1e6
    return None


def wait_healthy(port: int) -> float:
    """perf_counter of the first 200 on /health."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    url = f"http://127.0.0.1:{port}/health"
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(urllib.error.URLError, OSError, TimeoutError),
            urllib.request.urlopen(url, timeout=2) as resp,
        ):
            if resp.status == 200:
                return time.perf_counter()
        time.sleep(HEALTH_POLL)
    raise RuntimeError(f"no 200 on {url} within {BOOT_TIMEOUT:.0f} s")


def agent_rss_mib(container: Any, command: list[str]) -> float | None:
    needle = shlex.quote(" ".join(command))
    script = (
        "for p in /proc/[0-9]*; do "
        f"tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qF -- {needle} "
        "&& grep VmRSS $p/status; done"
    )
    out = container.exec_run(["sh", "-c", script]).output.decode()
    values = [int(line.split()[1]) for line in out.splitlines() if "VmRSS" in line]
    return max(values) / 1024 if values else None


def one_run(
    client: Any, image: str, label: str, settle: float
) -> tuple[float, float | None, float | None]:
    config = client.images.get(image).attrs["Config"]
    command = list(config.get("Cmd") or [])
    container = client.containers.create(
        image,
        name=f"acs-bench-boot-{secrets.token_hex(4)}",
        environment={"OH_SESSION_API_KEYS_0": secrets.token_urlsafe(24), "TZ": "UTC"},
        labels={"acs.bench": label},
        ports={f"{PORT}/tcp": ("127.0.0.1", None)},
        mem_limit="2g",
        security_opt=["no-new-privileges:true"],
        cap_drop=["ALL"],
        detach=True,
    )
    try:
        container.start()
        started = time.perf_counter()
        container.reload()
        port = int(container.attrs["NetworkSettings"]["Ports"][f"{PORT}/tcp"][0]["HostPort"])
        boot = wait_healthy(port) - started
        cpu = container_cpu(container.id)  # tini and the agent server, up to its first 200
        time.sleep(settle)
        return boot, cpu, agent_rss_mib(container, command)
    finally:
        container.remove(force=True, v=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", required=True, help="an image (repeat)")
    parser.add_argument("--runs", type=int, default=10, help="runs per image (10)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before RSS (1.0)")
    opt = parser.parse_args()
    client = docker.from_env()
    label = secrets.token_hex(4)
    samples = {image: Samples() for image in opt.image}
    try:
        for run in range(opt.runs + 1):  # run 0 warms the page cache and is not recorded
            order = opt.image if run % 2 == 0 else list(reversed(opt.image))
            for image in order:
                boot, cpu, rss = one_run(client, image, label, opt.settle)
                if run:
                    samples[image].boot.append(boot * 1000)
                    if cpu is not None:
                        samples[image].cpu.append(cpu * 1000)
                    if rss is not None:
                        samples[image].rss.append(rss)
    finally:
        for leftover in client.containers.list(all=True, filters={"label": f"acs.bench={label}"}):
            leftover.remove(force=True, v=True)
    print(f"{'image':40} | boot p50 ms | boot p95 ms | boot CPU p50 ms | idle RSS p50 MiB | runs")
    for image, s in samples.items():
        rss_text = f"{percentile(s.rss, 50):16.1f}" if s.rss else f"{'-':>16}"
        cpu_text = f"{percentile(s.cpu, 50):15.0f}" if s.cpu else f"{'-':>15}"
        p50, p95 = percentile(s.boot, 50), percentile(s.boot, 95)
        print(f"{image:40} | {p50:11.0f} | {p95:11.0f} | {cpu_text} | {rss_text} | {opt.runs}")
    first = samples[opt.image[0]]
    for image in opt.image[1:]:
        s = samples[image]
        ratio_boot = percentile(s.boot, 50) / percentile(first.boot, 50)
        line = f"{image} / {opt.image[0]}: boot p50 x{ratio_boot:.2f}"
        if s.cpu and first.cpu:
            line += f", boot CPU p50 x{percentile(s.cpu, 50) / percentile(first.cpu, 50):.2f}"
        if s.rss and first.rss:
            line += f", idle RSS x{statistics.median(s.rss) / statistics.median(first.rss):.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
