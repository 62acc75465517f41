"""Real-Docker fixtures: per-test container prefixes, cleanup, and logs dumped on failure."""

from __future__ import annotations

import ipaddress
import itertools
import json
import subprocess
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import docker
import pytest
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from drivers.docker import networks as docker_networks
from drivers.docker.firewall import HostFirewall
from drivers.docker.names import LABEL_PREFIX
from drivers.errors import DriverError
from tests.support.run_id import RUN_ID
from tests.support.sandbox_helpers import DEFAULT_IMAGE, OPENHANDS_IMAGE, REPO

_counter = itertools.count()
FIREWALL = HostFirewall()
_REMOVAL_ROUNDS = 10


def run_prefix() -> str:
    return f"acs-test-{RUN_ID}-"


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        pytest.fail(f"no Docker engine answers ({exc}); `make test` starts one", pytrace=False)
    _sweep_stale_networks(client)
    yield client
    remove_matching(client, run_prefix())
    client.close()


def _remove_container(container: Any) -> None:
    try:
        container.remove(force=True, v=True)
    except NotFound:
        pass
    except APIError as exc:
        # "removal … already in progress": the control plane's own removal (a rewind replacing
        # the container); the next round finds it gone.
        if exc.status_code != 409:
            raise


def remove_matching(client: docker.DockerClient, name_part: str) -> int:
    """Remove every container, volume and network whose name holds `name_part` (and the
    networks' firewall chains); how many containers and volumes there were."""
    # A control plane under test may still be starting a container (a launch or the warm
    # pool) while we list: a volume then answers 409 "in use" by a container we never saw.
    # So remove containers and volumes in rounds until a round finds nothing new in use.
    containers: set[str] = set()
    volume_names: set[str] = set()
    for _ in range(_REMOVAL_ROUNDS):
        # ignore_removed: docker-py inspects each listed container, and one may be removed
        # in between (a control plane under test still deleting it).
        listed = client.containers.list(all=True, filters={"name": name_part}, ignore_removed=True)
        for container in listed:
            containers.add(container.id or container.name or "")
            _remove_container(container)
        in_use = False
        for volume in client.volumes.list(filters={"name": name_part}):
            volume_names.add(volume.name)
            try:
                volume.remove(force=True)
            except NotFound:
                pass
            except APIError as exc:
                if exc.status_code != 409:
                    raise
                in_use = True
        if not in_use:
            break
        time.sleep(0.2)
    else:
        print(f"volumes matching {name_part} still in use after {_REMOVAL_ROUNDS} rounds")
    for network in client.api.networks(filters={"name": name_part}):
        if network["Name"].startswith(name_part):
            _remove_network(client, network["Name"])
    return len(containers) + len(volume_names)


def _remove_network(client: docker.DockerClient, name: str) -> None:
    """A sandbox network and its host firewall chains (which the control plane leaves in place:
    sandboxes outlive it)."""
    try:
        removed = docker_networks.remove_network(client, name)
    except DriverError as exc:
        print(f"could not remove network {name}: {exc}")
        return
    if removed and FIREWALL.unavailable() is None:
        FIREWALL.remove(docker_networks.bridge_name(name))


def _sweep_stale_networks(client: docker.DockerClient) -> None:
    """Networks of test runs that were killed before their clean-up, unused for a day: without
    this they would slowly fill the subnet pool. Younger ones may belong to a run in progress."""
    cutoff = datetime.now(UTC) - timedelta(days=1)
    for network in client.api.networks(filters={"name": "acs-test-"}):
        created = datetime.fromisoformat(network["Created"][:19] + "+00:00")
        if network["Name"].startswith("acs-test-") and created < cutoff:
            _remove_network(client, network["Name"])


@pytest.fixture(scope="session")
def docker_gateway(docker_client: docker.DockerClient) -> str:
    """The default Docker bridge's gateway (docker0): an address of this machine that is not
    loopback, for tests that need one."""
    configs = docker_client.api.inspect_network("bridge")["IPAM"]["Config"] or []
    for config in configs:
        if config.get("Gateway") and ":" not in config["Gateway"]:
            return str(config["Gateway"])
        subnet = config.get("Subnet", "")
        if subnet and ":" not in subnet:  # some engines leave Gateway out: the first address
            return str(next(ipaddress.ip_network(subnet, strict=False).hosts()))
    raise RuntimeError("the Docker bridge network has no IPv4 gateway")


@pytest.fixture(scope="session")
def sandbox_images(docker_client: docker.DockerClient) -> None:
    for image in (DEFAULT_IMAGE,):
        try:
            docker_client.images.get(image)
        except ImageNotFound:
            pytest.fail(f"image {image} is missing; run `make images`", pytrace=False)


@pytest.fixture(scope="session")
def openhands_image(docker_client: docker.DockerClient) -> str:
    """The official agent server's image, built once by scripts/build-images.sh (a few minutes
    from nothing; up to date in a second): `make images` skips it, as the spec is disabled."""
    started = time.monotonic()
    result = subprocess.run(
        [str(REPO / "scripts" / "build-images.sh"), "openhands"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"building the openhands image failed:\n{result.stderr[-4000:]}", pytrace=False)
    print(f"openhands image ready in {time.monotonic() - started:.1f}s:\n{result.stdout}")
    docker_client.images.get(OPENHANDS_IMAGE)
    return OPENHANDS_IMAGE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def test_prefix(
    request: pytest.FixtureRequest, docker_client: docker.DockerClient, sandbox_images: None
) -> Iterator[str]:
    """A container prefix of this test only; its containers are dumped on failure, then removed."""
    prefix = f"{run_prefix()}{next(_counter)}-"
    yield prefix
    containers = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL_PREFIX}={prefix}"}, ignore_removed=True
    )
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for container in containers:
            print(f"\n===== {container.name} ({container.status}) logs =====")
            print(container.logs(tail=100).decode(errors="replace"))
            print(f"===== {container.name} inspect State =====")
            print(json.dumps(container.attrs.get("State"), indent=1))
    remove_matching(docker_client, prefix)
