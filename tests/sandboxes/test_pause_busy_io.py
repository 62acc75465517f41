"""The API's pause of a sandbox whose agent does heavy I/O (drivers/docker/freezer.py): every
pause lands and the sandbox resumes; and where the cgroup freezer really refuses (cgroup v1:
a process in uninterruptible sleep, here a direct write the test throttles to a crawl on the
sandbox's own blkio cgroup, as a busy disk would be), the pause is retried until the write
returns and then lands, or, when it never returns in time, the caller gets a clear 503 and the
sandbox goes on RUNNING."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import APIError

from tests.support.log_capture import capture_logs
from tests.support.sandbox_helpers import agent_call, start_running, wait_status
from tests.support.snapshot_helpers import container
from tests.support.types import Client, ClientFactory, UserHeaders

CGROUPS = Path("/sys/fs/cgroup")
MIB = 1024**2
WRITER = (
    "nohup sh -c 'i=0; while :; do "
    "dd if=/dev/zero of=/workspace/io bs=1M count=8 conv=fsync 2>/dev/null; "
    "i=$((i+1)); echo $i > /workspace/count.new; mv /workspace/count.new /workspace/count; "
    "done' >/dev/null 2>&1 &"
)
"""Writes and fsyncs 8 MiB in a loop, counting rounds: heavy I/O from the agent's own command.
The count is renamed into place, so a reader never meets it truncated (`>` empties the file
before `echo` writes it: a read in between found '')."""


def agent_of(sandbox: dict[str, object]) -> tuple[str, str]:
    urls = sandbox["exposed_urls"]
    assert isinstance(urls, list)
    return str(urls[0]["url"]), str(sandbox["session_api_key"])


async def run(sandbox: dict[str, object], command: str) -> str:
    """`command` run by the sandbox's agent server, as the agent's user; its output."""
    url, key = agent_of(sandbox)
    result = await agent_call(url, key, command)
    assert result.get("exit_code") == 0, result
    return str(result["stdout"])


async def pause(client: Client, headers: dict[str, str], sandbox_id: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=headers)
    return resp.status, await resp.json()


async def resume(client: Client, headers: dict[str, str], sandbox_id: str) -> dict:  # type: ignore[type-arg]
    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=headers)
    assert resp.status == 200, await resp.text()
    return await wait_status(client, headers, sandbox_id, "RUNNING", within=60)


def frozen(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> bool:
    return bool(container(docker_client, prefix, sandbox_id).attrs["State"]["Paused"])


async def test_every_pause_of_a_sandbox_in_heavy_io_lands_and_it_resumes(
    make_sandbox_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    client = await make_sandbox_client()
    alice = await user_headers("alice")
    sandbox = await start_running(client, alice, within=90)
    await run(sandbox, WRITER)
    for _ in range(10):
        status, body = await pause(client, alice, sandbox["id"])
        assert status == 200, body
        assert await asyncio.to_thread(frozen, docker_client, test_prefix, sandbox["id"])
        sandbox = await resume(client, alice, sandbox["id"])
        assert not await asyncio.to_thread(frozen, docker_client, test_prefix, sandbox["id"])
    # The writer was never stopped for good: its rounds go on after the last resume.
    before = int((await run(sandbox, "cat /workspace/count")).strip())
    deadline = time.monotonic() + 30
    while int((await run(sandbox, "cat /workspace/count")).strip()) <= before:
        assert time.monotonic() < deadline, "the agent's writes did not go on after resume"
        await asyncio.sleep(0.2)


def blkio_of(pid: int) -> Path:
    """The blkio cgroup (v1) directory of process `pid`."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return CGROUPS / "blkio" / path.lstrip("/")
    raise AssertionError(f"process {pid} has no blkio cgroup")


def disk_of(path: str) -> str:
    """major:minor of the disk holding `path` (a partition's whole disk: blkio throttles
    disks)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    if (node / "partition").exists():
        node = node.parent
    return (node / "dev").read_text().strip()


def throttle(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> None:
    """Direct writes of the sandbox to its workspace's disk at 1 MiB/s (root only)."""
    attrs = container(docker_client, prefix, sandbox_id).attrs
    volume = next(m for m in attrs["Mounts"] if m["Destination"] == "/workspace")
    limit = blkio_of(int(attrs["State"]["Pid"])) / "blkio.throttle.write_bps_device"
    limit.write_text(f"{disk_of(volume['Source'])} {MIB}\n")


def in_disk_sleep(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> bool:
    """A `dd` of the sandbox is in uninterruptible sleep (state D) now."""
    top = container(docker_client, prefix, sandbox_id).top(ps_args="-eo pid,comm")
    for pid, comm in (row[:2] for row in top["Processes"]):
        if comm != "dd":
            continue
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "D":
                return True
        except OSError:
            continue
    return False


async def slow_direct_write(
    sandbox: dict[str, object],
    docker_client: docker.DockerClient,
    prefix: str,
    mib: int,
) -> None:
    """The agent starts a direct write of `mib` MiB (about `mib` seconds at the throttle):
    returned once it sleeps in the disk's queue."""
    await run(
        sandbox,
        f"nohup sh -c 'dd if=/dev/zero of=/workspace/slow bs={mib}M count=1 oflag=direct "
        "2>/workspace/slow.log; echo ended >> /workspace/slow.log' >/dev/null 2>&1 &",
    )
    deadline = time.monotonic() + 10
    while not await asyncio.to_thread(in_disk_sleep, docker_client, prefix, str(sandbox["id"])):
        assert time.monotonic() < deadline, "the direct write never waited on the disk"
        await asyncio.sleep(0.05)


Writing = tuple[Client, dict[str, str], dict[str, Any]]


@pytest.fixture
def writing_slowly(
    make_sandbox_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> Callable[[int], Awaitable[Writing]]:
    """`await writing_slowly(mib)`: an app, Alice, and a RUNNING sandbox of hers whose agent is
    in a throttled direct write of `mib` MiB."""

    async def make(mib: int) -> Writing:
        client = await make_sandbox_client()
        alice = await user_headers("alice")
        sandbox = await start_running(client, alice, within=90)
        await asyncio.to_thread(throttle, docker_client, test_prefix, sandbox["id"])
        await slow_direct_write(sandbox, docker_client, test_prefix, mib=mib)
        return client, alice, sandbox

    return make


async def write_ended(sandbox: dict[str, Any], within: float) -> str:
    """The slow write's log, once it says the write ended."""
    deadline = time.monotonic() + within
    while "ended" not in (log := await run(sandbox, "cat /workspace/slow.log")):
        assert time.monotonic() < deadline, log
        await asyncio.sleep(0.2)
    return log


def freezer_can_refuse() -> bool:
    """cgroup v1 with blkio and freezer hierarchies we may write (root): where the freezer gives
    up on a process in disk sleep. cgroup v2 freezes it where it sleeps."""
    return (
        (CGROUPS / "freezer").is_dir()
        and (CGROUPS / "blkio").is_dir()
        and os.access(CGROUPS / "blkio", os.W_OK)
    )


needs_v1_freezer = pytest.mark.skipif(
    not freezer_can_refuse(),
    reason="the freezer refuses only on cgroup v1 (a writable blkio hierarchy to slow a disk)",
)


@needs_v1_freezer
async def test_a_pause_the_freezer_refuses_is_retried_until_it_lands(
    writing_slowly: Callable[[int], Awaitable[Writing]],
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    # 6 s of writing: long enough that a loaded host's API pause still meets it, and shorter
    # than the retries (about 9 s).
    client, alice, sandbox = await writing_slowly(6)

    # The engine's own pause fails now: the condition is real, not assumed.
    name = container(docker_client, test_prefix, sandbox["id"]).name
    with pytest.raises(APIError, match="unable to freeze"):
        await asyncio.to_thread(docker_client.api.pause, name)
    assert not await asyncio.to_thread(frozen, docker_client, test_prefix, sandbox["id"])

    with capture_logs("info") as logs:
        status, body = await pause(client, alice, sandbox["id"])
    assert status == 200, body
    retries = [r for r in logs.events("docker_freeze_retry") if r["container"] == name]
    assert retries, "the pause landed without a retry: the write was not in the way"
    assert await asyncio.to_thread(frozen, docker_client, test_prefix, sandbox["id"])
    assert (await wait_status(client, alice, sandbox["id"], "PAUSED"))["status"] == "PAUSED"

    sandbox = await resume(client, alice, sandbox["id"])
    log = await write_ended(sandbox, within=30)
    assert f"{6 * MIB} bytes" in log, log  # the write completed whole


@needs_v1_freezer
async def test_a_pause_the_freezer_keeps_refusing_is_a_clear_503(
    writing_slowly: Callable[[int], Awaitable[Writing]],
    docker_client: docker.DockerClient,
    test_prefix: str,
) -> None:
    client, alice, sandbox = await writing_slowly(25)  # longer than the retries (about 9 s)

    status, body = await pause(client, alice, sandbox["id"])
    assert status == 503, body
    assert "could not stop its processes" in body["detail"], body
    assert "retry" in body["detail"], body
    # Nothing half-done: never left frozen, still RUNNING, and it pauses once the write is over.
    assert not await asyncio.to_thread(frozen, docker_client, test_prefix, sandbox["id"])
    got = await client.get(f"/api/v1/sandboxes/{sandbox['id']}", headers=alice)
    assert (await got.json())["status"] == "RUNNING"
    await write_ended(sandbox, within=60)
    status, body = await pause(client, alice, sandbox["id"])
    assert status == 200, body
