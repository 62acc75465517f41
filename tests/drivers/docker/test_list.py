"""The Docker driver's list (list_sandboxes) reads the engine's container summaries and inspects
only what they lack: every state it gives equals the container's inspect, in every container
state, and a container running or paused costs no inspect once it has been seen."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import docker
import pytest
from docker.errors import APIError

from drivers.base import RunState, SandboxState
from drivers.docker import names
from drivers.docker.driver import DockerDriver
from tests.support.sandbox_helpers import DEFAULT_IMAGE

# Starts once and exits, or (started again: the marker file exists) runs until removed.
_ONCE_THEN = "test -f /tmp/again && exec sleep 600; touch /tmp/again; "
_OOM = "x=$(head -c 200000000 /dev/zero | tr '\\0' a)"


@pytest.fixture
async def lister(test_prefix: str) -> AsyncIterator[DockerDriver]:
    """A driver of this test's prefix, on the engine's default bridge."""
    made = DockerDriver(prefix=test_prefix)
    yield made
    await made.close()


class Containers:
    """Containers labelled as the driver's sandboxes of `prefix`, made with the raw client."""

    def __init__(self, client: docker.DockerClient, prefix: str) -> None:
        self._api = client.api
        self._prefix = prefix

    def make(
        self, sandbox_id: str, script: str, *, owner: str = "alice", start: bool = True
    ) -> str:
        host = self._api.create_host_config(
            port_bindings={8000: ("127.0.0.1", None), 9000: ("127.0.0.1", None)},
            mem_limit=32 * 2**20,
            memswap_limit=32 * 2**20,
        )
        made = self._api.create_container(
            DEFAULT_IMAGE,
            None,
            # The script as PID 1 (not under the image's init, so that an OOM kill ends the
            # container itself); none: a program that does not exist, whose start fails.
            entrypoint=["sh", "-c", script] if script else ["/no/such/program"],
            name=names.container_name(self._prefix, sandbox_id),
            labels=names.labels(self._prefix, sandbox_id, owner, "default"),
            environment={"OH_SESSION_API_KEYS_0": f"key-{sandbox_id}", "WITH": "a=b"},
            ports=[8000, 9000],
            host_config=host,
        )
        container_id = str(made["Id"])
        if start:
            # A start that fails leaves the container CREATED, with its error.
            with contextlib.suppress(APIError):
                self._api.start(container_id)
        return container_id

    def settled(self, container_id: str, status: str) -> None:
        for _ in range(100):
            if self._api.inspect_container(container_id)["State"]["Status"] == status:
                return
            time.sleep(0.1)
        raise AssertionError(f"{container_id} never became {status}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


@pytest.fixture
def containers(docker_client: docker.DockerClient, test_prefix: str) -> Containers:
    return Containers(docker_client, test_prefix)  # removed by test_prefix's clean-up


async def listed(driver: DockerDriver, owner: str | None = None) -> dict[str, SandboxState]:
    return {s.sandbox_id: s for s in await driver.list_sandboxes(owner)}


async def assert_as_inspected(driver: DockerDriver, owner: str | None = None) -> int:
    """Every listed state equals the sandbox's inspect; how many were listed."""
    found = await listed(driver, owner)
    for sandbox_id, state in found.items():
        assert state == await driver.inspect(sandbox_id), sandbox_id
    return len(found)


async def counted_inspects(driver: DockerDriver, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The container ids the driver's engine client inspects from now on (the calls go on to
    the engine)."""
    client = await driver.engine.call(lambda c: c)
    real: Callable[..., Any] = client.api.inspect_container
    seen: list[str] = []

    def inspect_container(container: str) -> Any:
        seen.append(container)
        return real(container)

    monkeypatch.setattr(client.api, "inspect_container", inspect_container)
    return seen


async def test_every_listed_state_is_the_inspected_one(
    lister: DockerDriver, containers: Containers
) -> None:
    await asyncio.to_thread(containers.make, "running", "exec sleep 600")
    paused = await asyncio.to_thread(containers.make, "paused", "exec sleep 600", owner="bob")
    await asyncio.to_thread(containers.pause, paused)
    exited = await asyncio.to_thread(containers.make, "exited", "exit 3")
    oom = await asyncio.to_thread(containers.make, "oom", _OOM)
    restarted = await asyncio.to_thread(containers.make, "after-oom", _ONCE_THEN + _OOM)
    await asyncio.to_thread(containers.make, "created", "exec sleep 600", start=False)
    await asyncio.to_thread(containers.make, "failed-start", "")  # no such program
    for container_id in (exited, oom, restarted):
        await asyncio.to_thread(containers.settled, container_id, "exited")
    await asyncio.to_thread(containers.start, restarted)  # running again after an OOM kill

    found = await listed(lister)
    assert {k: s.status for k, s in found.items()} == {
        "running": RunState.RUNNING,
        "paused": RunState.PAUSED,
        "exited": RunState.EXITED,
        "oom": RunState.EXITED,
        "after-oom": RunState.RUNNING,
        "created": RunState.CREATED,
        "failed-start": RunState.CREATED,
    }
    assert (found["exited"].exit_code, found["exited"].oom_killed) == (3, False)
    assert (found["oom"].exit_code, found["oom"].oom_killed) == (137, True)
    assert not found["after-oom"].oom_killed  # a past run's kill is not a running one's
    assert "/no/such/program" in (found["failed-start"].error or "")
    running = found["running"]
    assert set(running.endpoints) == {8000, 9000}
    assert running.env["OH_SESSION_API_KEYS_0"] == "key-running"
    assert running.env["WITH"] == "a=b"
    assert running.addresses
    assert running.created_at is not None
    assert running.name == names.container_name(lister.prefix, "running")

    # Twice: the second list reads the running and paused ones from their summaries.
    assert await assert_as_inspected(lister) == 7
    assert await assert_as_inspected(lister) == 7
    assert await assert_as_inspected(lister, "bob") == 1
    assert await assert_as_inspected(lister, "alice") == 6


async def test_a_seen_running_or_paused_container_costs_no_inspect(
    lister: DockerDriver, containers: Containers, monkeypatch: pytest.MonkeyPatch
) -> None:
    inspects = await counted_inspects(lister, monkeypatch)
    running = [
        await asyncio.to_thread(containers.make, f"running-{i}", "exec sleep 600") for i in range(3)
    ]
    exited = await asyncio.to_thread(containers.make, "exited", "exit 3")
    await asyncio.to_thread(containers.settled, exited, "exited")

    assert len(await listed(lister)) == 4
    assert sorted(inspects) == sorted([*running, exited])  # each seen for the first time
    inspects.clear()
    assert len(await listed(lister)) == 4
    assert inspects == [exited]  # its last stop's details are the inspect's only
    inspects.clear()

    # Changes show without an inspect: the state is the summary's, not a kept one.
    await asyncio.to_thread(containers.pause, running[0])
    await asyncio.to_thread(containers.stop, running[1], timeout=1)
    await asyncio.to_thread(containers.remove_container, running[2], force=True)
    found = await listed(lister)
    assert {k: s.status for k, s in found.items()} == {
        "running-0": RunState.PAUSED,
        "running-1": RunState.EXITED,
        "exited": RunState.EXITED,
    }
    assert sorted(inspects) == sorted([running[1], exited])
    stopped = await lister.inspect("running-1")
    assert stopped is not None
    assert found["running-1"] == stopped
    assert found["running-1"].exit_code in (137, 143)  # SIGTERM, or SIGKILL after 1 s
    inspects.clear()

    # The same sandbox made again is another container: inspected once, as a new one.
    again = await asyncio.to_thread(containers.make, "running-2", "exec sleep 600")
    assert (await listed(lister))["running-2"].status == RunState.RUNNING
    assert sorted(inspects) == sorted([again, running[1], exited])


async def test_the_list_forgets_the_containers_it_no_longer_sees(
    lister: DockerDriver, containers: Containers
) -> None:
    made = {
        owner: await asyncio.to_thread(containers.make, owner, "exec sleep 600", owner=owner)
        for owner in ("alice", "bob")
    }
    await listed(lister)
    assert len(lister.facts) == 2
    await asyncio.to_thread(containers.remove_container, made["alice"], force=True)
    await listed(lister, "bob")  # another owner's list leaves alice's facts alone
    assert len(lister.facts) == 2
    await listed(lister, "alice")
    assert len(lister.facts) == 1
    await asyncio.to_thread(containers.remove_container, made["bob"], force=True)
    assert await listed(lister) == {}
    assert len(lister.facts) == 0
