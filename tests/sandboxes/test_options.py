"""Per-spec isolation options on real containers: gVisor (`runtime: runsc`), a read-only root
filesystem with tmpfs scratch space; and what happens without a host firewall."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controlplane import keys
from controlplane.config import ServiceConfig
from controlplane.sandboxes.launcher import network_policy
from controlplane.sandboxes.webhook_listener import WebhookListener
from controlplane.specs.catalog import SpecCatalog
from drivers.docker.driver import DockerDriver
from drivers.docker.firewall import HostFirewall
from drivers.errors import FirewallRequired, NetworkUnavailable
from tests.support.live_server import attachment
from tests.support.sandbox_helpers import (
    DEFAULT_IMAGE,
    OwnDocker,
    agent_call,
    exec_as_agent,
    probe_from,
    spec_dir,
    start,
    wait_status,
)
from tests.support.types import Client

COMMAND = '["/opt/agent/bin/python", "-P", "-m", "agent", "--port", "8000"]'
GVISOR = f"""
id: gvisor
description: the default image under gVisor
image: {DEFAULT_IMAGE}
command: {COMMAND}
exposed_ports: {{AGENT_SERVER: 8000}}
runtime: runsc
"""
READ_ONLY = f"""
id: read-only
description: the default image on a read-only root
image: {DEFAULT_IMAGE}
command: {COMMAND}
exposed_ports: {{AGENT_SERVER: 8000}}
read_only_root: true
"""
pytestmark = [
    pytest.mark.usefixtures("sandbox_images"),
    pytest.mark.sbx_specs({"gvisor": GVISOR, "read-only": READ_ONLY}),
]

CLOSED = f"""
id: closed
image: {DEFAULT_IMAGE}
exposed_ports: {{AGENT_SERVER: 8000}}
egress: none
"""

# Inside the sandbox: the webhook, with the sandbox's own key, for a conversation it does not
# have (200 means: reached and authenticated; such a post is acknowledged and dropped, while a
# wrong key would be a 401 and a blocked network no answer at all).
WEBHOOK = r"""
import json, os, urllib.request, urllib.error
req = urllib.request.Request(
    os.environ["OH_WEBHOOKS_0_BASE_URL"] + "/conversations", method="POST",
    data=json.dumps({"id": "0" * 32}).encode(),
    headers={"Content-Type": "application/json",
             "X-Session-API-Key": os.environ["OH_SESSION_API_KEYS_0"]})
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


async def running(sbx: Client, headers: dict[str, str], spec: str) -> dict[str, Any]:
    started = await start(sbx, headers, spec)
    return await wait_status(sbx, headers, started["id"], "RUNNING", within=90)


async def test_the_default_image_runs_under_gvisor(
    sbx_with_specs: Client,
    user_headers: Any,
    own_docker: OwnDocker,
) -> None:
    if "runsc" not in (own_docker.client.info().get("Runtimes") or {}):
        pytest.skip(
            "the Docker engine has no runsc runtime: scripts/install-gvisor.sh (run by `make "
            "test` as root) installs Debian's runsc and registers it; it could not here"
        )
    alice = await user_headers("alice")
    sandbox = await running(sbx_with_specs, alice, "gvisor")
    container = own_docker.container(sandbox["id"])
    assert container.attrs["HostConfig"]["Runtime"] == "runsc"
    agent = sandbox["exposed_urls"][0]
    result = await agent_call(agent["url"], sandbox["session_api_key"], "uname -r; id -u")
    assert result["stdout"].split() == ["4.4.0", "1000"], result  # gVisor's kernel, not ours

    # Its network and firewall are the same as under runc: the webhook works, the rest of the
    # host does not answer.
    code, out = await asyncio.to_thread(exec_as_agent, container, "python3", "-c", WEBHOOK)
    assert (code, out.splitlines()[-1]) == (0, "200"), out
    gateway = await attachment(sbx_with_specs.app, sbx_with_specs.app[keys.SPECS].get("gvisor"))
    assert (await probe_from(container, [(gateway.gateway, 22)]))[(gateway.gateway, 22)] != "open"

    resp = await sbx_with_specs.post(f"/api/v1/sandboxes/{sandbox['id']}/pause", headers=alice)
    assert resp.status == 200
    resp = await sbx_with_specs.post(f"/api/v1/sandboxes/{sandbox['id']}/resume", headers=alice)
    assert resp.status == 200
    resumed = await wait_status(sbx_with_specs, alice, sandbox["id"], "RUNNING")
    result = await agent_call(resumed["exposed_urls"][0]["url"], resumed["session_api_key"], "pwd")
    assert result["stdout"].strip() == "/workspace"


async def test_read_only_root_keeps_the_workspace_home_and_tmp_writable(
    sbx_with_specs: Client,
    user_headers: Any,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    sandbox = await running(sbx_with_specs, alice, "read-only")
    container = own_docker.container(sandbox["id"])
    host = container.attrs["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert set(host["Tmpfs"]) == {"/tmp", "/home/agent", "/var/lib/acs-agent"}
    agent, key = sandbox["exposed_urls"][0]["url"], sandbox["session_api_key"]
    writes = "echo a > /workspace/a && echo b > ~/b && echo c > /tmp/c"
    result = await agent_call(agent, key, f"{writes} && cat /workspace/a ~/b /tmp/c")
    assert result["stdout"].split() == ["a", "b", "c"], result
    for target in ("/etc/x", "/usr/local/bin/x", "/opt/agent/x", "/var/tmp/x"):
        result = await agent_call(agent, key, f"echo x > {target}")
        assert result["exit_code"] != 0, (target, result)
        assert "Read-only file system" in result["stderr"], result


async def test_without_a_host_firewall(
    config: ServiceConfig, tmp_path: Path, test_prefix: str
) -> None:
    """`on` refuses to start; `auto` starts, says so, and refuses restricted-egress specs."""
    catalog = SpecCatalog.load(spec_dir(tmp_path, {"closed": CLOSED}))
    missing = HostFirewall("acs-no-such-iptables")
    listener = WebhookListener(0)
    with pytest.raises(FirewallRequired, match="acs-no-such-iptables is not installed"):
        DockerDriver(prefix=test_prefix, listener=listener, firewall_mode="on", firewall=missing)
    driver = DockerDriver(prefix=test_prefix, listener=listener, firewall=missing)
    try:
        networks = driver.networks
        assert networks is not None
        assert not networks.managed
        assert networks.firewall_off_reason == "acs-no-such-iptables is not installed"
        with pytest.raises(NetworkUnavailable, match="restricts egress"):
            await networks.prepare(network_policy(catalog.get("closed")))
        # The listener needs an app before the first network is prepared (create_app's does).
        listener.attach(web.Application())
        attached = await networks.prepare(network_policy(catalog.default))
        assert attached.network == f"{test_prefix}net"
        assert attached.extra_hosts == {"host.docker.internal": attached.gateway}
        await listener.close()
    finally:
        await driver.close()


async def test_iptables_without_nftables_refuses_to_start(test_prefix: str) -> None:
    """Releases before the nftables table fenced a host with iptables alone: upgraded on such a
    host without `nft`, `auto` refuses to start instead of leaving every sandbox unfenced (the
    host's services, metadata addresses, and egress: none)."""
    half = HostFirewall(nft="acs-no-such-nft")
    assert half.unavailable() == "acs-no-such-nft is not installed"
    with pytest.raises(FirewallRequired, match="acs-no-such-nft is not installed: install it"):
        DockerDriver(prefix=test_prefix, listener=WebhookListener(0), firewall=half)
