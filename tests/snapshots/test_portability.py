"""A snapshot taken through one Docker engine starts a sandbox on another (a second dockerd of
the test's own, tests/support/second_engine.py): the store is the only bridge, as between two
hosts. The first control plane goes away first, as a host that is gone would; the second one
shares its Redis, its secret and its store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane import keys
from drivers.docker import names as docker_names
from tests.support.second_engine import SUBNET_POOL, SecondEngine
from tests.support.snapshot_helpers import running, sh, snapshot
from tests.support.types import ClientFactory, UserHeaders

pytestmark = [pytest.mark.slow]


@pytest.fixture
def engine() -> Iterator[SecondEngine]:
    second = SecondEngine()
    try:
        second.start()
        yield second
    finally:
        second.stop()


async def test_a_snapshot_starts_a_sandbox_on_another_engine(
    engine: SecondEngine,  # first: it stops after the apps on it closed
    make_snap_client: ClientFactory,
    user_headers: UserHeaders,
    docker_client: object,
    test_prefix: str,
) -> None:
    first = await make_snap_client()
    alice = await user_headers("alice")
    source = await running(first, alice)
    await sh(
        docker_client,  # type: ignore[arg-type]
        test_prefix,
        source["id"],
        "echo travelled > /workspace/mark && mkdir -p ~/.local && echo tool > ~/.local/tool",
    )
    taken = await snapshot(first, alice, source["id"])
    spec_image = first.app[keys.SPECS].default.image
    helper_image = first.app[keys.CONFIG].base_image
    await first.close()  # the first host is gone

    engine.load(spec_image, helper_image)
    second = await make_snap_client(
        docker_url=engine.url, sandbox_subnet_pool=SUBNET_POOL, host_firewall="off"
    )
    restored = await running(second, alice, snapshot_id=taken["id"])
    name = docker_names.container_name(test_prefix, restored["id"])
    out = engine.cli("exec", name, "sh", "-c", "cat /workspace/mark ~/.local/tool").stdout
    assert out.decode().split() == ["travelled", "tool"]
    assert (await second.delete(f"/api/v1/sandboxes/{restored['id']}", headers=alice)).status == 200
    # Its base went with it: nothing of the snapshot stays on the second engine.
    assert engine.cli("volume", "ls", "-q").stdout.decode().strip() == ""
    await second.close()
