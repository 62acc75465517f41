"""The contract every sandbox driver keeps (drivers/base.py, docs/architecture.md "Drivers"),
run against each driver through the interface alone: a real sandbox of the default spec, its
agent server reached at the endpoint the driver hands back, and the control plane's webhook
listener reached at the URL the driver gives the sandbox.

Not a test module itself: each runtime's `test_driver_contract.py` (tests/drivers/docker/,
tests/drivers/kubernetes/) imports these tests and defines the `driver` fixture (and, where the
runtime needs it, `test_prefix`); a new runtime adds a module of the same shape. Those two are
the suite's one intended case of a fixture defined in several places (tests/test_fixture_names.py
allows it there and nowhere else).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import os
import shlex
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from controlplane.config import ServiceConfig, load_config
from controlplane.sandboxes.launcher import network_policy, sandbox_request
from controlplane.sandboxes.models import SandboxRecord
from controlplane.sandboxes.naming import new_sandbox_id
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER, SandboxSpec
from drivers.base import (
    STATE,
    SYSTEM,
    WORKSPACE,
    FileEntry,
    FileItem,
    FileKind,
    NetworkPolicy,
    RunState,
    SandboxDriver,
    SandboxEvent,
    SandboxFiles,
    SandboxRequest,
    SandboxState,
)
from drivers.errors import ContainerExists, DriverError, ImageMissing
from tests.support.sandbox_helpers import REPO, agent_call

BOOT = 60.0  # seconds an agent server may take to answer /health on a loaded host


class Hooks:
    """The control plane's side of the webhook listener: records what sandboxes post."""

    def __init__(self) -> None:
        self.posts: list[str] = []
        self.app = web.Application()
        self.app.router.add_post("/api/v1/webhooks/{sandbox_id}/{rest:.*}", self._post)

    async def _post(self, request: web.Request) -> web.Response:
        self.posts.append(request.path)
        return web.json_response({"success": True})


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


@pytest.fixture
def contract_config(test_prefix: str, tmp_path: Path) -> ServiceConfig:
    return load_config(
        {},
        container_prefix=test_prefix,
        data_dir=tmp_path / "data",
        image_tag=os.environ.get("ACS_IMAGE_TAG") or None,
    )


@pytest.fixture
def spec(contract_config: ServiceConfig) -> SandboxSpec:
    return SpecCatalog.load(REPO / "specs", contract_config.image_tag).default


MakeRequest = Callable[..., Awaitable[SandboxRequest]]


@pytest.fixture
def make_request(
    driver: SandboxDriver, contract_config: ServiceConfig, spec: SandboxSpec
) -> MakeRequest:
    """A request as the launcher makes it: the network prepared first, the webhook URL it
    returns in the sandbox's environment."""

    async def make(owner: str = "alice", **changes: Any) -> SandboxRequest:
        record = SandboxRecord.starting(new_sandbox_id(), owner, spec.id)
        base = await driver.prepare_network(network_policy(spec))
        return dataclasses.replace(sandbox_request(contract_config, record, spec, base), **changes)

    return make


def agent_url(state: SandboxState, spec: SandboxSpec) -> str:
    """The agent server at the endpoint the driver handed back for its port."""
    endpoint = state.endpoints[spec.exposed_ports[AGENT_SERVER]]
    return f"http://{endpoint.host}:{endpoint.port}"


async def healthy(state: SandboxState, spec: SandboxSpec, base: str | None = None) -> None:
    """The agent server answers /health at its endpoint (or at `base`)."""
    deadline = time.monotonic() + BOOT
    last: object = None
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                url = f"{base or agent_url(state, spec)}/health"
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
                    last = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = exc
            await asyncio.sleep(0.1)
    raise AssertionError(f"agent server of {state.sandbox_id} not healthy in {BOOT}s: {last!r}")


async def run(state: SandboxState, spec: SandboxSpec, key: str, command: str) -> dict[str, Any]:
    """A shell command in the sandbox, through its agent server's bash API."""
    return await agent_call(agent_url(state, spec), key, command)


async def running(
    driver: SandboxDriver, request: SandboxRequest, spec: SandboxSpec
) -> SandboxState:
    state = await driver.create(request, new=True)
    await healthy(state, spec)
    return state


async def marked(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> tuple[SandboxRequest, str, SandboxState]:
    """A running sandbox with a file in its workspace: (its request, its key, its state)."""
    request = await make_request()
    key = request.env["OH_SESSION_API_KEYS_0"]
    state = await running(driver, request, spec)
    wrote = await run(state, spec, key, f"echo kept > {spec.working_dir}/mark")
    assert wrote["exit_code"] == 0, wrote
    return request, key, state


async def test_the_runtime_answers_and_tells_its_capacity(driver: SandboxDriver) -> None:
    assert await driver.ping() is True
    capacity = await driver.memory_capacity()
    assert capacity is not None
    assert capacity > 64 * 1024**2
    assert driver.has_room(1024**2) is True


async def test_image_identity(driver: SandboxDriver, spec: SandboxSpec) -> None:
    # A runtime may learn of an image a while after it arrived: a kubelet lists its node's
    # images every 30 s (the test cluster's images were loaded moments ago).
    deadline = time.monotonic() + 45
    first = await driver.image_id(spec.image)
    while not first and time.monotonic() < deadline:
        await asyncio.sleep(1)
        first = await driver.image_id(spec.image)
    assert first
    assert await driver.image_id(spec.image) == first  # stable while the image is
    assert await driver.image_id("acs-no-such-image:latest") is None


async def test_a_sandbox_from_create_to_remove(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request = await make_request()
    state = await running(driver, request, spec)
    assert (state.sandbox_id, state.owner, state.spec_id) == (request.sandbox_id, "alice", spec.id)
    assert state.status == RunState.RUNNING
    assert set(state.endpoints) == set(request.ports)
    assert state.env["OH_SESSION_API_KEYS_0"] == request.env["OH_SESSION_API_KEYS_0"]

    inspected = await driver.inspect(request.sandbox_id)
    assert inspected is not None
    assert (inspected.sandbox_id, inspected.status) == (request.sandbox_id, RunState.RUNNING)
    assert inspected.endpoints == state.endpoints
    listed = {s.sandbox_id: s for s in await driver.list_sandboxes()}
    assert request.sandbox_id in listed
    assert request.sandbox_id in {s.sandbox_id for s in await driver.list_sandboxes("alice")}
    assert request.sandbox_id not in {s.sandbox_id for s in await driver.list_sandboxes("bob")}
    # Where a driver offers a closer address (the sandbox proxy's), the ports answer there.
    direct = await driver.direct_address(request.sandbox_id)
    if direct is not None:
        await healthy(state, spec, f"http://{direct}:{spec.exposed_ports[AGENT_SERVER]}")

    await driver.remove(request.sandbox_id)
    assert await driver.inspect(request.sandbox_id) is None
    assert await driver.direct_address(request.sandbox_id) is None
    await driver.remove(request.sandbox_id)  # already gone: success
    assert request.sandbox_id not in {s.sandbox_id for s in await driver.list_sandboxes()}


async def test_create_refuses_an_existing_sandbox_and_leaves_it_alone(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request = await make_request()
    await running(driver, request, spec)
    with pytest.raises(ContainerExists):
        await driver.create(request, new=True)
    state = await driver.inspect(request.sandbox_id)
    assert state is not None
    assert state.status == RunState.RUNNING
    await healthy(state, spec)


async def test_the_sandbox_networks_hold_every_sandboxs_address(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    """What the control plane never connects to for a user covers every address a sandbox
    has (its own, read inside it)."""
    _, key, state = await marked(driver, make_request, spec)
    local = "awk '/32 host LOCAL/ {print last} {last = $2}' /proc/net/fib_trie | sort -u"
    out = await run(state, spec, key, local)
    addresses = [a for a in out["stdout"].split() if not a.startswith("127.")]
    assert addresses, out
    networks = [ipaddress.ip_network(n) for n in await driver.sandbox_networks()]
    for address in addresses:
        assert any(ipaddress.ip_address(address) in n for n in networks), (address, networks)


async def test_a_missing_image_leaves_nothing(
    driver: SandboxDriver, make_request: MakeRequest
) -> None:
    request = await make_request(image="acs-no-such-image:latest")
    with pytest.raises(ImageMissing):
        await driver.create(request, new=True)
    assert await driver.inspect(request.sandbox_id) is None
    assert request.sandbox_id not in {s.sandbox_id for s in await driver.list_sandboxes()}


async def test_pause_and_resume_keep_the_workspace(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request, key, _state = await marked(driver, make_request, spec)

    await driver.pause(request.sandbox_id)
    await driver.pause(request.sandbox_id)  # pausing a paused sandbox succeeds
    paused = await driver.inspect(request.sandbox_id)
    assert paused is not None
    assert paused.status in (RunState.PAUSED, RunState.EXITED)
    if paused.status == RunState.PAUSED:
        await driver.unpause(request.sandbox_id)
        resumed = await driver.inspect(request.sandbox_id)
    else:  # a runtime whose pause releases the instance: a new one on the kept workspace
        resumed = await driver.start(request)
    assert resumed is not None
    assert resumed.status == RunState.RUNNING
    await healthy(resumed, spec)
    read = await run(resumed, spec, key, f"cat {spec.working_dir}/mark")
    assert read["stdout"].strip() == "kept", read


async def test_unpause_refuses_a_running_sandbox(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request = await make_request()
    await running(driver, request, spec)
    with pytest.raises(DriverError):
        await driver.unpause(request.sandbox_id)


async def test_a_re_create_keeps_the_workspace_a_remove_drops_it(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request, key, _state = await marked(driver, make_request, spec)

    await driver.remove(request.sandbox_id, keep_workspace=True)
    assert await driver.inspect(request.sandbox_id) is None
    again = await driver.create(request)  # not new: the kept workspace is found
    await healthy(again, spec)
    read = await run(again, spec, key, f"cat {spec.working_dir}/mark")
    assert read["stdout"].strip() == "kept", read

    await driver.remove(request.sandbox_id)
    fresh = await driver.create(request)
    await healthy(fresh, spec)
    gone = await run(fresh, spec, key, f"cat {spec.working_dir}/mark")
    assert gone["exit_code"] != 0, gone


async def test_the_watch_reports_changes_of_the_deployments_sandboxes(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request = await make_request()
    await running(driver, request, spec)
    seen: asyncio.Queue[SandboxEvent | Exception | None] = asyncio.Queue()
    watch = driver.watch(seen.put_nowait)
    try:
        await asyncio.sleep(0.5)  # the stream is opened in the background
        deadline = time.monotonic() + 30
        found = False
        while not found and time.monotonic() < deadline:
            await driver.pause(request.sandbox_id)
            if driver.pause_releases:  # the instance is gone: a new one on the workspace
                await driver.start(request)
            else:
                await driver.unpause(request.sandbox_id)
            try:
                while True:
                    item = await asyncio.wait_for(seen.get(), 2)
                    assert not isinstance(item, Exception), item
                    assert item is not None
                    if item.sandbox_id == request.sandbox_id:
                        found = True
                        break
            except TimeoutError:
                continue
        assert found, "no event for the sandbox"
    finally:
        watch.close()


async def test_the_sandbox_reaches_the_control_plane_at_the_url_it_was_given(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec, hooks: Hooks
) -> None:
    """Also at the host address the driver names (what the LLM gateway calls for a model server
    the user wrote as host.docker.internal): an address of this host that sandboxes reach."""
    base = await driver.prepare_network(network_policy(spec))
    assert base is not None, "this driver's sandboxes need ACS_PUBLIC_URL"
    assert await driver.prepare_network(network_policy(spec)) == base  # idempotent
    address = await driver.host_address(network_policy(spec))
    assert address is not None
    with socket.socket() as probe:
        probe.bind((address, 0))  # an address of this host
    request = await make_request()
    key = request.env["OH_SESSION_API_KEYS_0"]
    state = await running(driver, request, spec)
    port = base.rsplit(":", 1)[1]
    for reached_at in (base, f"http://{address}:{port}"):
        url = f"{reached_at}/api/v1/webhooks/{request.sandbox_id}/contract"
        post = (
            "import urllib.request as u; "
            f"print(u.urlopen(u.Request({json.dumps(url)}, data=b'{{}}', method='POST')).status)"
        )
        result = await run(state, spec, key, f"python3 -c {shlex.quote(post)}")
        assert result["stdout"].strip().splitlines()[-1] == "200", result
    assert hooks.posts.count(f"/api/v1/webhooks/{request.sandbox_id}/contract") == 2


async def test_egress_none_admits_the_webhook_listener_alone(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec, hooks: Hooks
) -> None:
    """A sandbox of a policy with no egress still posts its webhooks; another port at the
    very address it reaches the control plane at does not answer it."""
    closed = NetworkPolicy(f"{spec.id}-closed", ())
    base = await driver.prepare_network(closed)
    assert base is not None
    other = web.AppRunner(web.Application())
    await other.setup()
    site = web.TCPSite(other, "0.0.0.0", 0)  # noqa: S104 (every address the sandbox could try)
    await site.start()
    port = int(other.addresses[0][1])
    try:
        request = await make_request(network=closed)
        key = request.env["OH_SESSION_API_KEYS_0"]
        state = await running(driver, request, spec)
        host = base.split("://", 1)[1].rsplit(":", 1)[0]
        probe = (
            "import socket, urllib.request as u\n"
            f"print(u.urlopen(u.Request({json.dumps(base + '/api/v1/webhooks/x/ready')},"
            " data=b'{}', method='POST'), timeout=5).status)\n"
            f"s = socket.socket(); s.settimeout(3)\n"
            "try:\n"
            f"    s.connect(({json.dumps(host)}, {port})); print('open')\n"
            "except OSError:\n"
            "    print('closed')\n"
        )
        result = await run(state, spec, key, f"python3 -c {shlex.quote(probe)}")
        assert result["stdout"].split()[-2:] == ["200", "closed"], result
    finally:
        await other.cleanup()


async def test_hibernate_gives_the_instance_back_and_start_brings_it_back(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    request, key, _state = await marked(driver, make_request, spec)
    await driver.pause(request.sandbox_id)
    await driver.hibernate(request.sandbox_id)
    asleep = await driver.inspect(request.sandbox_id)
    assert asleep is not None
    assert asleep.status == RunState.EXITED  # no process, so no memory held
    back = await driver.start(request)
    await healthy(back, spec)
    read = await run(back, spec, key, f"cat {spec.working_dir}/mark")
    assert read["stdout"].strip() == "kept", read


class _Hold:
    def __init__(self, driver: SandboxDriver, sandbox_id: str) -> None:
        self.driver, self.sandbox_id = driver, sandbox_id
        self.calls: list[str] = []
        self.seen: RunState | None = None

    async def begin(self) -> None:
        self.calls.append("begin")

    async def end(self) -> None:
        self.calls.append("end")
        state = await self.driver.inspect(self.sandbox_id)
        self.seen = state.status if state else None


class _Files:
    """A FileSource over items held in memory."""

    def __init__(self, key: str, items: list[FileItem]) -> None:
        self.key = key
        self._items = items

    async def items(self, held: Collection[str] = ()) -> AsyncIterator[FileItem]:
        skipping = False
        for item in self._items:
            if isinstance(item, bytes):
                if not skipping:
                    yield item
                continue
            skipping = item.tree == WORKSPACE and item.path in held
            yield item

    async def workspace(self) -> list[FileEntry]:
        return [i for i in self._items if isinstance(i, FileEntry) and i.tree == WORKSPACE]


async def _exported(
    files: SandboxFiles, request: SandboxRequest, known: dict[Any, Any], hold: Any
) -> tuple[list[FileItem], float]:
    items: list[FileItem] = []
    async with files.export(
        request.sandbox_id,
        known,
        working_dir=request.working_dir,
        state_paths=request.kept_paths,
        hold=hold,
    ) as export:
        async for item in export.items:
            items.append(item)
    return items, export.held_still


async def test_files_are_exported_consistently_and_restored_into_a_new_sandbox(
    driver: SandboxDriver, make_request: MakeRequest, spec: SandboxSpec
) -> None:
    files = driver.files
    if files is None:
        pytest.skip("this runtime does not export files yet")
    request, key, state = await marked(driver, make_request, spec)
    kept = request.kept_paths[0]
    wrote = await run(state, spec, key, f"echo outside > /tmp/outside && echo s > {kept}/probe")
    assert wrote["exit_code"] == 0, wrote

    hold = _Hold(driver, request.sandbox_id)
    items, held = await _exported(files, request, {}, hold)
    assert hold.calls == ["begin", "end"]  # held still once, around the second look
    assert 0 < held < 5
    assert hold.seen == RunState.RUNNING  # let go before the export is read: not left frozen
    entries = {(i.tree, i.path): i for i in items if isinstance(i, FileEntry)}
    mark = entries[(WORKSPACE, "mark")]
    assert mark.kind == FileKind.FILE
    assert items[items.index(mark) + 1] == b"kept\n"
    # What changed outside the workspace and the kept paths, where the runtime reaches it.
    assert ((SYSTEM, "tmp/outside") in entries) == files.keeps_system
    if not files.keeps_system:
        assert not [e for e in entries if e[0] == SYSTEM]
    assert (STATE, f"{kept.strip('/')}/probe") in entries  # the agent server's own state

    # Only what changed since comes with bytes the second time.
    known = dict(entries)
    again = await run(state, spec, key, f"echo new > {spec.working_dir}/new")
    assert again["exit_code"] == 0, again
    second, _ = await _exported(files, request, known, _Hold(driver, request.sandbox_id))
    sent = [i.path for i in second if isinstance(i, FileEntry) and i.kind == "file" and i.changed]
    assert "new" in sent
    assert "mark" not in sent

    copy = await make_request(restore=_Files(new_sandbox_id(), items))
    restored = await running(driver, copy, spec)
    copy_key = copy.env["OH_SESSION_API_KEYS_0"]
    read = await run(restored, spec, copy_key, f"cat {spec.working_dir}/mark /tmp/outside")
    assert read["stdout"].split() == ["kept", "outside"][: 1 + files.keeps_system], read
    await driver.remove(copy.sandbox_id)  # and what the runtime kept for the copy
