"""`up` clears what a killed run of the same cluster left, and `down` leaves nothing behind: the
host's processes, mounts, interfaces, routes, iptables rules, cgroups and files are listed before
a cluster of its own exists, while it runs (the listing must then see it), and after `down`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from tests.drivers.kubernetes.conftest import (
    KubeCluster,
    api_client,
    bring_up,
    wait_service_account,
)
from tests.drivers.kubernetes.pods import pod_manifest, wait_pod

pytestmark = [pytest.mark.kube, pytest.mark.slow]

# Where a kubelet, dockershim, the controller manager or `ip netns` would write by default; the
# cluster must keep every one of them in its own state directory.
HOST_DEFAULT_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/dockershim",
    "/var/run/dockershim.sock",
    "/var/run/kubernetes",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/tmp/hostpath_pv",
    "/tmp/hostpath_provisioner",
)


def shim_sockets(slot: int) -> list[Path]:
    """The sockets the cluster's containerd shims made in the host-wide /run/containerd/s:
    sha256("<containerd address>/<namespace>/<container id>"), read off their command lines."""
    sockets = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[0].endswith("containerd-shim-runc-v2") and f"/acs-kube-{slot}/" in " ".join(argv):
            flags = dict(zip(argv[1::2], argv[2::2], strict=False))
            key = f"{flags['-address']}/{flags['-namespace']}/{flags['-id']}"
            sockets.append(Path("/run/containerd/s") / hashlib.sha256(key.encode()).hexdigest())
    assert all(socket.exists() for socket in sockets), sockets
    return sockets


def footprint(slot: int, namespace: str) -> dict[str, list[str]]:
    """Everything on this host that belongs to cluster slot `slot` (whose names all carry
    acsk<slot> or acs-kube-<slot>, and whose addresses are 10.<240+slot>.x.x)."""
    names = re.compile(rf"acsk{slot}\b|acsk{slot}[-/a-z0-9]|acs-kube-{slot}\b")
    net = f"10.{240 + slot}."

    def lines(*argv: str) -> list[str]:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()

    processes = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            membership = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if names.search(membership) or names.search(cmdline):
            processes.append(f"{proc.name} {cmdline[:120]}")
    cgroups = [
        str(path)
        for hierarchy in Path("/sys/fs/cgroup").iterdir()
        for path in hierarchy.glob(f"acsk{slot}")
    ]
    pod_logs = [
        str(entry)
        for directory in ("/var/log/pods", "/var/log/containers")
        if os.path.isdir(directory)
        for entry in Path(directory).iterdir()
        if namespace in entry.name
    ]
    return {
        "processes": sorted(processes),
        "mounts": [line for line in lines("cat", "/proc/self/mountinfo") if names.search(line)],
        "links": [line for line in lines("ip", "-o", "link") if names.search(line)],
        "routes": [line for line in lines("ip", "route") if net in line],
        "iptables": [line for line in lines("iptables-save") if net in line or names.search(line)],
        "netns": [line for line in lines("ip", "netns", "list") if names.search(line)],
        "cgroups": cgroups,
        "files": [
            p
            for p in (f"/tmp/acs-kube-{slot}", f"/dev/shm/acs-kube-{slot}-etcd")
            if os.path.exists(p)
        ],
        "host_defaults": [p for p in HOST_DEFAULT_PATHS if os.path.lexists(p)],
        "pod_logs": pod_logs,
    }


async def start_pod_with_mounts(cluster: KubeCluster, namespace: str) -> None:
    """A pod with a claim and a service-account token, so that the kubelet and dockerd make
    their mounts (volume tmpfs, overlay, netns, shm) and log links."""
    api = await api_client(cluster.kubeconfig)
    async with api:
        core = client.CoreV1Api(api)
        await core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
        await wait_service_account(core, namespace)
        await core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "work"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Mi"}},
                },  # the default StorageClass
            },
        )
        # The pause image: every node has it from bring-up, so nothing needs loading here.
        manifest = pod_manifest(
            "sleeper",
            "",
            volumes=[{"name": "work", "persistentVolumeClaim": {"claimName": "work"}}],
            mounts=[{"name": "work", "mountPath": "/work"}],
        )
        container = manifest["spec"]["containers"][0]
        container["image"] = json.loads(cluster.cli("env", "--json"))["pause_image"]
        del container["command"]
        await core.create_namespaced_pod(namespace, manifest)
        await wait_pod(core, namespace, "sleeper")


async def test_up_clears_a_killed_run_and_down_leaves_nothing(kube_cluster: KubeCluster) -> None:
    # A cluster of this test's own, beside the session's (which must be unaffected). Its owner
    # is a process that ends at once: to the next `up` the cluster is what a killed run left.
    owner = await asyncio.create_subprocess_exec("true")
    await owner.wait()
    namespace = "teardown-probe"
    before = {slot: footprint(slot, namespace) for slot in range(4)}
    first = await asyncio.to_thread(bring_up, owner.pid)
    slot = first.slot
    assert slot != kube_cluster.slot
    try:
        await start_pod_with_mounts(first, namespace)
        running = footprint(slot, namespace)
        # Not pod_logs: the session cluster's kubelets may already have removed this pod's
        # entries from the shared /var/log/pods (see pods.pod_log); `down` must still clear any.
        for kind in ("processes", "mounts", "links", "routes", "cgroups", "files"):
            assert running[kind], f"the listing saw no {kind} of a running cluster: {running}"
        assert running["host_defaults"] == before[slot]["host_defaults"], running
        assert running["iptables"] == [], "the host's iptables must never see the cluster"
        sockets = shim_sockets(slot)
        assert sockets, "no containerd shim of the cluster was found"

        # `up` on the same slot: the leftovers go first (owner dead), then a new cluster.
        out = await asyncio.to_thread(first.cli, "up", "--nodes", "2", timeout=180)
        again = KubeCluster.from_info(json.loads(out))
        assert again.slot == slot
        await start_pod_with_mounts(again, namespace)
    finally:
        out = await asyncio.to_thread(first.cli, "down")
    print(f"down: {out.strip()}")
    after = footprint(slot, namespace)
    assert after == before[slot]
    assert [socket for socket in sockets if socket.exists()] == []
    assert after["processes"] == after["mounts"] == after["cgroups"] == after["files"] == []
    # The session's cluster still answers.
    api = await api_client(kube_cluster.kubeconfig)
    async with api:
        nodes = (await client.CoreV1Api(api).list_node()).items
        assert len(nodes) == len(kube_cluster.nodes)
