"""The whole sandbox lifecycle against the real Docker engine and Redis."""

from __future__ import annotations

from tests.support.sandbox_helpers import (
    OwnDocker,
    agent_call,
    start,
    start_running,
    wait_status,
)
from tests.support.types import ClientFactory, UserHeaders


async def test_start_pause_resume_delete(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory()  # a reconciler every second
    alice = await user_headers("alice")
    started = await start(sbx, alice)
    assert started["session_api_key"] is None
    assert started["created_by_user_id"] == "alice"
    assert started["sandbox_spec_id"] == "default"
    sandbox_id = started["id"]

    running = await wait_status(sbx, alice, sandbox_id, "RUNNING")
    key = running["session_api_key"]
    assert key
    (agent,) = [u for u in running["exposed_urls"] if u["name"] == "AGENT_SERVER"]
    assert agent["url"] == f"http://127.0.0.1:{agent['port']}"
    result = await agent_call(agent["url"], key, "echo hello > note.txt && pwd && cat note.txt")
    assert result["exit_code"] == 0
    assert result["stdout"].split() == ["/workspace", "hello"]

    (container,) = own_docker.containers()
    assert container.name == f"{own_docker.prefix}{sandbox_id}"
    assert container.labels["acs.sandbox_id"] == sandbox_id
    assert container.labels["acs.owner"] == "alice"
    assert container.labels["acs.spec_id"] == "default"
    host = container.attrs["HostConfig"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Memory"] == 1024**3
    assert host["PidsLimit"] == 512
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["CapDrop"] == ["ALL"]
    assert not host["CapAdd"]
    assert container.attrs["Config"]["User"] == "1000:1000"
    assert host["NetworkMode"] == f"{own_docker.prefix}net"
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    assert host["ExtraHosts"] == [f"host.docker.internal:{network['Gateway']}"]
    assert host["PortBindings"]["8000/tcp"][0]["HostIp"] == "127.0.0.1"
    assert not any("docker.sock" in m["Source"] for m in container.attrs["Mounts"])
    (mount,) = container.attrs["Mounts"]
    assert mount["Type"] == "volume"
    assert mount["Destination"] == "/workspace"

    resp = await sbx.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
    assert (resp.status, await resp.json()) == (200, {"success": True})
    container.reload()
    assert container.status == "paused"
    paused = await wait_status(sbx, alice, sandbox_id, "PAUSED", within=1)
    assert paused["session_api_key"] is None
    assert paused["exposed_urls"] is None
    resp = await sbx.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
    assert resp.status == 200, "pausing a paused sandbox is a no-op that succeeds"

    resp = await sbx.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200
    resumed = await wait_status(sbx, alice, sandbox_id, "RUNNING")
    assert resumed["session_api_key"] == key
    result = await agent_call(agent["url"], key, "cat note.txt")
    assert result["stdout"].strip() == "hello"
    resp = await sbx.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200, "resuming a running sandbox is a no-op that succeeds"

    resp = await sbx.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert (resp.status, await resp.json()) == (200, {"success": True})
    assert own_docker.containers() == []
    assert own_docker.volumes() == []
    resp = await sbx.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 404
    resp = await sbx.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 404


async def test_stopped_container_restarts_on_resume_with_files(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory()  # a reconciler every second
    alice = await user_headers("alice")
    running = await start_running(sbx, alice)
    sandbox_id = running["id"]
    url = running["exposed_urls"][0]["url"]
    await agent_call(url, running["session_api_key"], "echo kept > kept.txt")

    (container,) = own_docker.containers()
    container.stop(timeout=2)  # as after a host reboot
    stopped = await wait_status(sbx, alice, sandbox_id, "PAUSED", within=15)
    assert "stopped outside the control plane" in stopped["reason"]

    resp = await sbx.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200
    again = await wait_status(sbx, alice, sandbox_id, "RUNNING")
    new_url = again["exposed_urls"][0]["url"]
    result = await agent_call(new_url, again["session_api_key"], "cat kept.txt")
    assert result["stdout"].strip() == "kept"


async def test_removed_container_is_missing_and_resume_recreates_it(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory()  # a reconciler every second
    alice = await user_headers("alice")
    running = await start_running(sbx, alice)
    sandbox_id = running["id"]
    await agent_call(
        running["exposed_urls"][0]["url"], running["session_api_key"], "echo survives > s.txt"
    )
    (container,) = own_docker.containers()
    container.remove(force=True)  # volume stays: only the container is gone
    missing = await wait_status(sbx, alice, sandbox_id, "MISSING", within=15)
    assert "removed outside the control plane" in missing["reason"]

    resp = await sbx.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200
    again = await wait_status(sbx, alice, sandbox_id, "RUNNING")
    result = await agent_call(
        again["exposed_urls"][0]["url"], again["session_api_key"], "cat s.txt"
    )
    assert result["stdout"].strip() == "survives"


async def test_paused_and_unpaused_behind_our_back(
    sbx_factory: ClientFactory,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    sbx = await sbx_factory()  # a reconciler every second
    alice = await user_headers("alice")
    sandbox_id = (await start_running(sbx, alice))["id"]
    (container,) = own_docker.containers()
    container.pause()
    await wait_status(sbx, alice, sandbox_id, "PAUSED", within=10)
    container.unpause()
    await wait_status(sbx, alice, sandbox_id, "RUNNING", within=10)
    container.kill()
    killed = await wait_status(sbx, alice, sandbox_id, "PAUSED", within=10)
    assert "exit code 137" in killed["reason"]
