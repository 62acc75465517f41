"""Snapshot fixtures (a plugin of tests/conftest.py, for tests/snapshots/ and tests/security/):
one real OCI registry per session (Debian's docker-registry, tests/support/registry_server.py),
a repository of each test's own in it, and apps whose snapshots are stored there."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from tests.support.docker_fixtures import remove_matching
from tests.support.registry_server import RegistryServer
from tests.support.types import Client, ClientFactory


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    server = RegistryServer(tmp_path_factory.mktemp("registry"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def snapshot_repository(test_prefix: str) -> str:
    """This test's repository prefix in the registry (a name the registry takes)."""
    return re.sub(r"[^a-z0-9]+", "-", test_prefix.lower()).strip("-")


@pytest.fixture
def snapshot_settings(registry: RegistryServer, snapshot_repository: str) -> dict[str, Any]:
    return {
        "snapshot_store_url": registry.url,
        "snapshot_store_repository": snapshot_repository,
        "snapshot_collect_interval": 3600.0,  # tests run the collector themselves
        "snapshot_collect_grace": 0.0,
        "snapshot_upload_settle": 1.0,  # assert_nothing_orphaned waits for it
    }


@pytest.fixture
def base_images(test_prefix: str, docker_client: docker.DockerClient) -> Iterator[str]:
    """The repository of the base images this test's restores make (drivers/docker/bases.py),
    removed after the test with the containers that run them (after the apps closed)."""
    base = re.sub(r"[^a-z0-9]+", "-", test_prefix.lower()).strip("-") + "-base"
    yield base
    remove_matching(docker_client, test_prefix)
    for image in docker_client.images.list(name=base):
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(str(image.id), force=True)


@pytest.fixture
def make_snap_client(
    base_images: str, make_sandbox_client: ClientFactory, snapshot_settings: dict[str, Any]
) -> ClientFactory:
    """Apps with sandboxes and snapshots in the test's repository."""

    async def make(**overrides: Any) -> Client:
        return await make_sandbox_client(**(snapshot_settings | overrides))

    return make


@pytest.fixture
async def snap(make_snap_client: ClientFactory) -> Client:
    return await make_snap_client()
