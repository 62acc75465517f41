"""Snapshots on the test cluster through the control plane's API (issue 28, item 5): a snapshot of
a running sandbox on one node starts a sandbox on the other node (the first is cordoned, as a
drained or lost node would be), and a fork of two; a sandbox's hostile workspace (links out of
it, made by the agent inside the sandbox) restores as links, never followed; a sandbox held
still by a control plane that goes away is let go. Files are written and read back through each
sandbox's own agent server, as its user would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kubernetes_asyncio import client

from drivers.kubernetes.api import KubeApi
from drivers.kubernetes.exec import Exec
from drivers.kubernetes.files import HOLD_SCRIPT
from drivers.kubernetes.names import LABEL_FILES, label_value, pod_name, selector
from drivers.kubernetes.objects import CONTAINER
from drivers.kubernetes.settings import Credentials
from tests.drivers.kubernetes.sandbox_objects import KINDS, api_get, objects
from tests.drivers.kubernetes.test_sandboxes import run
from tests.support.sandbox_helpers import start_running, wait_status
from tests.support.snapshot_helpers import snapshot
from tests.support.types import Client

pytestmark = [pytest.mark.kube, pytest.mark.slow]
Headers = Callable[..., Awaitable[dict[str, str]]]


async def node_of(kube_api: client.ApiClient, namespace: str, prefix: str, sandbox_id: str) -> str:
    pod = (await objects(kube_api, namespace, prefix)).pod(sandbox_id)
    return str(pod["spec"]["nodeName"])


@asynccontextmanager
async def cordoned(kube_api: client.ApiClient, node: str) -> AsyncIterator[None]:
    """Nothing new lands on `node` meanwhile (a drained node; uncordoned after)."""
    core = client.CoreV1Api(kube_api)
    await core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        await core.patch_node(node, {"spec": {"unschedulable": None}})


async def no_helpers_left(kube_api: client.ApiClient, namespace: str, prefix: str) -> None:
    core = client.CoreV1Api(kube_api)
    selector = f"{LABEL_FILES}={label_value(prefix)}"
    for _ in range(100):
        pods = await core.list_namespaced_pod(namespace, label_selector=selector)
        if not pods.items:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"helper pods left: {[p.metadata.name for p in pods.items]}")


async def test_a_snapshot_taken_on_one_node_starts_sandboxes_on_the_other(
    snap_kube: Client,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = snap_kube
    alice = await user_headers("alice")
    source = await start_running(api, alice, within=90)
    wrote = await run(
        source,
        "mkdir -p /workspace/src && echo travelled > /workspace/mark && "
        "echo 'print(1)' > /workspace/src/main.py && chmod 640 /workspace/src/main.py && "
        "ln -s mark /workspace/alias && head -c 3000000 /dev/urandom > /workspace/blob && "
        "md5sum /workspace/blob",
    )
    blob_sum = wrote["stdout"].split()[0]
    source_node = await node_of(kube_api, ns, prefix, source["id"])

    taken = await snapshot(api, alice, source["id"])
    # Running: held still (its processes stopped) for a moment, measured.
    assert 0 < taken["held_still_seconds"] < 5, taken
    assert taken["files"] >= 5, taken
    assert taken["size_bytes"] >= 3_000_000, taken
    await no_helpers_left(kube_api, ns, prefix)
    # The source goes on after the hold.
    assert (await run(source, "echo alive"))["stdout"].strip() == "alive"

    async with cordoned(kube_api, source_node):
        restored = await start_running_from(api, alice, taken["id"])
        forked = await post_once_listed(
            api, f"/api/v1/sandboxes/{source['id']}/fork", {"count": 2}, alice
        )
        forks = [
            await wait_status(api, alice, s["id"], "RUNNING", within=120)
            for s in forked["sandboxes"]
        ]

    for sandbox in [restored, *forks]:
        assert await node_of(kube_api, ns, prefix, sandbox["id"]) != source_node
        out = await run(
            sandbox,
            "cat /workspace/mark /workspace/src/main.py && stat -c '%a %u' /workspace/src/main.py "
            "&& readlink /workspace/alias && md5sum /workspace/blob",
        )
        assert out["stdout"].split() == [
            "travelled",
            "print(1)",
            "640",
            "1000",
            "mark",
            blob_sum,
            "/workspace/blob",
        ], out
    # Every new sandbox has its own session key: nothing secret is shared or restored.
    keys = {s["session_api_key"] for s in [source, restored, *forks]}
    assert len(keys) == 4
    await no_helpers_left(kube_api, ns, prefix)

    # The restored files' signatures were carried (the loader's record): the restored
    # sandbox's first snapshot reads only what changed since, however it hides (the same size,
    # its mtime set back), and holds it.
    await run(
        restored,
        'cd /workspace && m="$(stat -c %y mark)" && echo TRAVELLED > mark && touch -d "$m" mark',
    )
    again = await snapshot(api, alice, restored["id"])
    assert again["parent_id"] == taken["id"]
    assert 10 <= again["read_bytes"] < 3_000_000, again
    later = await start_running_from(api, alice, again["id"])
    out = await run(later, "cat /workspace/mark && md5sum /workspace/blob")
    assert out["stdout"].split() == ["TRAVELLED", blob_sum, "/workspace/blob"], out


async def test_links_out_of_a_paused_workspace_restore_as_links(
    snap_kube: Client,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
    kube_api: client.ApiClient,
) -> None:
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    api = snap_kube
    alice = await user_headers("alice")
    source = await start_running(api, alice, within=90)
    # The agent, inside its sandbox, points links out of the workspace (at the node's /etc as the
    # helper would see it, at the claim's root) and leaves a fifo: none is followed or read.
    await run(
        source,
        "cd /workspace && ln -s /etc etc-link && ln -s /etc/passwd passwd-link && "
        "ln -s ../.. up-link && mkfifo pipe && echo mine > own.txt",
    )
    assert (await api.post(f"/api/v1/sandboxes/{source['id']}/pause", headers=alice)).status == 200
    await wait_status(api, alice, source["id"], "PAUSED", within=30)
    # Its pod's containers ended (a snapshot of a paused sandbox waits for that, as its kubelet
    # reports them: late on a busy test host, past a minute in CI, hence the long wait; the pod
    # object itself may linger while its volumes are torn down).
    path = KINDS["pods"].format(ns=ns)
    deadline = time.monotonic() + 240
    while True:
        listed = await api_get(kube_api, path, labelSelector=selector(prefix))
        name = pod_name(prefix, source["id"])
        pods = [p for p in listed.get("items") or [] if p["metadata"]["name"] == name]
        states = [
            c.get("state") or {}
            for p in pods
            for c in (p.get("status") or {}).get("containerStatuses") or []
        ]
        if not any("running" in state for state in states):
            break
        assert time.monotonic() < deadline, f"the paused sandbox's pod still runs: {states}"
        await asyncio.sleep(0.5)

    taken = await snapshot(api, alice, source["id"])
    assert taken["held_still_seconds"] == 0  # no pod: nothing to hold
    # The workspace root, own.txt and three links: not a file of /etc, no fifo.
    assert taken["files"] <= 6, taken

    restored = await start_running_from(api, alice, taken["id"])
    out = await run(
        restored,
        "cd /workspace && ls -A | sort | tr '\\n' ' ' && readlink etc-link passwd-link up-link "
        "&& test -L etc-link && test -L up-link && echo links && cat own.txt",
    )
    assert out["stdout"].split() == [
        "etc-link",
        "own.txt",
        "passwd-link",
        "up-link",
        "/etc",
        "/etc/passwd",
        "../..",
        "links",
        "mine",
    ], out
    await no_helpers_left(kube_api, ns, prefix)


async def post_once_listed(
    api: Client, path: str, body: dict[str, Any], headers: dict[str, str]
) -> Any:
    """POST a restore or a fork. A restore checks first that a node lists the spec's image,
    and a kubelet lists the images it holds only every 30 s or so: right after the fixture
    loaded them onto a new cluster, that is retried."""
    for _ in range(60):
        resp = await api.post(path, json=body, headers=headers)
        answer = await resp.json()
        if resp.status != 503 or "is not on the runtime" not in answer.get("detail", ""):
            break
        await asyncio.sleep(1)
    assert resp.status == 200, answer
    return answer


async def start_running_from(api: Client, headers: dict[str, str], snapshot_id: str) -> Any:
    made = await post_once_listed(api, "/api/v1/sandboxes", {"snapshot_id": snapshot_id}, headers)
    return await wait_status(api, headers, made["id"], "RUNNING", within=120)


async def test_a_hold_whose_control_plane_is_gone_lets_the_sandbox_go(
    snap_kube: Client,
    kube_overrides: dict[str, Any],
    user_headers: Headers,
) -> None:
    """The hold as a snapshot runs it (files.py), its stream then dropped as a control plane
    killed in the middle would drop it: the sandbox is stopped while held, and goes on at
    once when the stream ends (the reconciler cannot thaw a Kubernetes sandbox)."""
    ns, prefix = kube_overrides["kube_namespace"], kube_overrides["container_prefix"]
    alice = await user_headers("alice")
    source = await start_running(snap_kube, alice, within=90)
    api = KubeApi(Credentials(kubeconfig=str(kube_overrides["kubeconfig"])))
    try:
        stopper = await Exec.open(
            api, ns, pod_name(prefix, source["id"]), CONTAINER, ["sh", "-c", HOLD_SCRIPT],
            what="a hold",
        )  # fmt: skip
        assert await stopper.line() == "held"
        with pytest.raises(TimeoutError):  # its agent server is stopped
            await asyncio.wait_for(run(source, "echo moving"), 3)
        await stopper.close()  # dropped without a word
        answered = await asyncio.wait_for(run(source, "echo moving"), 10)
        assert answered["stdout"].strip() == "moving"
    finally:
        await api.close()
