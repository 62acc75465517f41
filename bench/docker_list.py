"""What the Docker driver's list of a deployment's sandboxes costs (`DockerDriver.list_sandboxes`,
each warm pool pass and reconciler sweep), beside the engine's own list call.

Run: `.venv/bin/python -m bench.docker_list [--levels 20,100] [--lists 20] [--rounds 2]`.
bench/README.md says what it measures and how.

For each level, that many running containers labelled as one deployment's sandboxes (the small
files image, `sleep`, one published port), then, interleaved round by round so that the host's
load hits each alike, the process CPU and wall time per list of:
- raw: the engine's list alone (`GET /containers/json` with the deployment's label), the floor;
- inspect each: that list and an inspect of every container it names (what the driver did until
  branch pool-list);
- the driver: `list_sandboxes()` (the summaries, an inspect only for what they lack), after its
  first list has seen the containers.
The containers are removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import docker

from drivers.docker import names
from drivers.docker.driver import DockerDriver

IMAGE = "acs-base:bookworm"


def make_containers(client: docker.DockerClient, prefix: str, start: int, end: int) -> None:
    api = client.api

    def make(n: int) -> None:
        sandbox_id = f"list{n:04d}"
        host = api.create_host_config(port_bindings={8000: ("127.0.0.1", None)})
        made = api.create_container(
            IMAGE,
            ["sleep", "3600"],
            name=names.container_name(prefix, sandbox_id),
            labels=names.labels(prefix, sandbox_id, "bench", "default"),
            environment={"OH_SESSION_API_KEYS_0": f"key-{n}"},
            ports=[8000],
            host_config=host,
        )
        api.start(made["Id"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(make, range(start, end)))


def remove_containers(client: docker.DockerClient, prefix: str) -> int:
    found = client.api.containers(all=True, filters={"label": [f"{names.LABEL_PREFIX}={prefix}"]})
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda c: client.api.remove_container(c["Id"], force=True), found))
    return len(found)


async def per_list(
    n: int, call: Callable[[], Awaitable[int]], expected: int
) -> tuple[float, float]:
    """Process CPU and wall ms per call over `n` calls, one at a time."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        got = await call()
        if got != expected:
            raise RuntimeError(f"listed {got} containers, {expected} expected")
    return (
        (time.process_time() - cpu) / n * 1000,
        (time.perf_counter() - wall) / n * 1000,
    )


async def measure(levels: list[int], lists: int, rounds: int) -> list[str]:
    prefix = f"acs-bench-list-{os.getpid()}-"
    client = docker.from_env()
    driver = DockerDriver(prefix=prefix)
    filters = {"label": [f"{names.LABEL_PREFIX}={prefix}"]}

    def raw() -> int:
        return len(client.api.containers(all=True, filters=filters))

    def inspect_each() -> int:
        found = client.api.containers(all=True, filters=filters)
        return len([client.api.inspect_container(c["Id"]) for c in found])

    async def listed() -> int:
        return len(await driver.list_sandboxes())

    kinds: dict[str, Callable[[], Awaitable[int]]] = {
        "raw: the engine's list": lambda: asyncio.to_thread(raw),
        "inspect each (before)": lambda: asyncio.to_thread(inspect_each),
        "the driver's list": listed,
    }
    lines = [
        f"CPU and wall per list, ms (median of {rounds} rounds of {lists} lists; "
        f"load avg {os.getloadavg()[0]:.2f} at the start)",
        "| containers | " + " | ".join(f"{k} CPU / wall" for k in kinds) + " | driver / raw CPU |",
        "| --- | " + " | ".join("---" for _ in kinds) + " | --- |",
    ]
    made = 0
    try:
        for level in levels:
            print(f"{level} containers: making {level - made}", file=sys.stderr)
            await asyncio.to_thread(make_containers, client, prefix, made, level)
            made = level
            await listed()  # the driver's first sight of the new ones
            figures: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
            for _ in range(rounds):
                for kind, call in kinds.items():
                    figures[kind].append(await per_list(lists, call, level))
            medians = {
                k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
                for k, v in figures.items()
            }
            cells = " | ".join(f"{c:.2f} / {w:.2f}" for c, w in medians.values())
            ratio = medians["the driver's list"][0] / medians["raw: the engine's list"][0]
            lines.append(f"| {level} | {cells} | {ratio:.2f}x |")
            print(lines[-1], file=sys.stderr)
    finally:
        await driver.close()
        removed = await asyncio.to_thread(remove_containers, client, prefix)
        client.close()
        print(f"removed {removed} containers", file=sys.stderr)
    lines.append(f"load avg at the end: {os.getloadavg()[0]:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="20,100", help="containers listed (20,100)")
    parser.add_argument("--lists", type=int, default=20, help="lists per kind and round (20)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the kinds (2)")
    args = parser.parse_args(argv)
    levels = sorted(int(n) for n in args.levels.split(",") if n)
    if not levels or levels[0] <= 0:
        parser.error("--levels: positive counts, e.g. 20,100")
    try:
        lines = asyncio.run(measure(levels, args.lists, args.rounds))
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
