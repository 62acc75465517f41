"""What the command line does: up, describe/env, status, kill-node, start-node, load-image."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from kubecluster.api import (
    Api,
    bootstrap_objects,
    default_service_account_ready,
    node_conditions,
    set_pod_cidrs,
)
from kubecluster.components import (
    docker_answers,
    etcd_healthy,
    load_pause_image,
    node_docker,
    start_apiserver,
    start_controllers,
    start_dockerd,
    start_etcd,
    start_kube_proxy,
    start_kubelet,
    start_node_runtime,
)
from kubecluster.configs import write_configs
from kubecluster.host import (
    ClusterError,
    alive,
    log,
    log_tail,
    rss_bytes,
    run,
    wait_for,
    write_json,
)
from kubecluster.layout import (
    BUILD_SCRIPT,
    MEMORY_STORE_SIZE,
    NODE_LEASE_DURATION_S,
    NODE_MONITOR_GRACE_S,
    NODE_MONITOR_PERIOD_S,
    PAUSE_IMAGE,
    STORAGE_CLASS,
    Layout,
)
from kubecluster.network import make_network
from kubecluster.pki import make_pki
from kubecluster.slots import locked
from kubecluster.teardown import cgroup_pids, teardown


def binaries() -> Path:
    """The cached binaries' directory (scripts/kube/build.sh builds them the first time)."""
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, check=False, text=True)
    if result.returncode != 0:
        raise ClusterError("building the Kubernetes binaries failed (see above)")
    return Path(result.stdout.strip().splitlines()[-1])


def up(layout: Layout, bins: Path, *, down_on_failure: bool = False) -> dict[str, Any]:
    """Bring the cluster up from nothing (clearing the slot's leftovers first). On failure the
    cluster stays as it is for a look at its logs, unless `down_on_failure`."""
    with locked(layout.lock_file):
        owner = layout.owner_file.read_text() if layout.owner_file.exists() else None
        cleared = teardown(layout)
        if cleared["killed"] or cleared["unmounted"]:
            log(f"cleared the leftovers of an earlier run of slot {layout.slot}: {cleared}")
        layout.state_dir.mkdir(parents=True)
        if owner:
            layout.owner_file.write_text(owner)
        try:
            return _up(layout, bins)
        except BaseException:
            if down_on_failure:
                teardown(layout)
            else:
                log(f"bring-up failed; logs are in {layout.state_dir / 'logs'} until `down`")
            raise


def _up(layout: Layout, bins: Path) -> dict[str, Any]:
    timings: dict[str, float] = {}
    started = time.monotonic()

    def mark(name: str) -> None:
        timings[name] = round(time.monotonic() - started, 2)

    layout.volumes_dir.mkdir(parents=True)
    layout.memory_dir.mkdir()
    run(["mount", "-t", "tmpfs", "-o", f"size={MEMORY_STORE_SIZE},mode=0700",
         f"acs-kube-{layout.slot}", str(layout.memory_dir)])  # fmt: skip
    make_pki(layout)
    write_configs(layout)
    make_network(layout)
    mark("prepared")
    start_etcd(layout)
    for index in layout.node_indexes():
        start_dockerd(layout, index)
    wait_for("etcd", lambda: etcd_healthy(layout), 30, diagnose=lambda: log_tail(layout, "etcd"))
    mark("etcd")
    start_apiserver(layout, bins)
    for index in layout.node_indexes():
        wait_for(
            f"dockerd of node {index}",
            lambda index=index: docker_answers(layout, index),
            30,
            diagnose=lambda index=index: log_tail(layout, f"dockerd-{index}"),
        )
        load_pause_image(layout, index, bins)
        # Before the API server answers: the kubelet's own start-up (cAdvisor, the runtime)
        # overlaps the API server's, and it registers as soon as it can.
        start_kubelet(layout, index, bins)
        start_kube_proxy(layout, index, bins)
    mark("dockerd")
    api = Api(layout)
    wait_for("the API server", api.ready, 60, diagnose=lambda: log_tail(layout, "kube-apiserver"))
    mark("apiserver")
    start_controllers(layout, bins)
    bootstrap_objects(layout, api)
    names = [layout.node_name(index) for index in layout.node_indexes()]
    wait_for(
        "the nodes to register",
        lambda: set(names) <= set(node_conditions(api)),
        60,
        diagnose=lambda: "\n".join(log_tail(layout, f"kubelet-{i}") for i in layout.node_indexes()),
    )
    set_pod_cidrs(layout, api)
    wait_for(
        "the nodes to be Ready",
        lambda: all(node_conditions(api)[n].get("Ready") == "True" for n in names),
        60,
        diagnose=lambda: "\n".join(log_tail(layout, f"kubelet-{i}") for i in layout.node_indexes()),
    )
    mark("nodes_ready")
    wait_for(
        "the default service account",
        lambda: default_service_account_ready(api),
        30,
        diagnose=lambda: log_tail(layout, "kube-controller-manager"),
    )
    mark("ready")
    info = describe(layout)
    info["timings"] = timings
    write_json(layout.info_file, info)
    return info


def describe(layout: Layout) -> dict[str, Any]:
    """What clients need to use the cluster."""
    return {
        "slot": layout.slot,
        "kubeconfig": str(layout.kubeconfig),
        "server": layout.server,
        "host_address": layout.host_ip,
        "service_cidr": layout.service_cidr,
        "cluster_cidr": layout.cluster_cidr,
        "storage_class": STORAGE_CLASS,
        "pause_image": PAUSE_IMAGE,
        "state_dir": str(layout.state_dir),
        # A node whose kubelet dies is NotReady (its pods not Ready) about grace_s after its
        # last lease renewal (every lease_duration_s / 4), checked every period_s.
        "node_monitor": {
            "period_s": NODE_MONITOR_PERIOD_S,
            "grace_s": NODE_MONITOR_GRACE_S,
            "lease_duration_s": NODE_LEASE_DURATION_S,
        },
        "nodes": [
            {
                "name": layout.node_name(index),
                "index": index,
                "ip": layout.node_ip(index),
                "pod_cidr": layout.pod_cidr(index),
                "docker_host": f"unix://{layout.docker_socket(index)}",
                "netns": str(layout.netns(f"n{index}")),
            }
            for index in layout.node_indexes()
        ],
    }


def read_info(layout: Layout) -> dict[str, Any]:
    if not layout.info_file.exists():
        raise ClusterError(f"no cluster is up in slot {layout.slot} (no {layout.info_file})")
    info: dict[str, Any] = json.loads(layout.info_file.read_text())
    return info


def node_pids(layout: Layout) -> dict[str, int]:
    pids_file = layout.state_dir / "pids.json"
    return json.loads(pids_file.read_text()) if pids_file.exists() else {}


def kill_node(layout: Layout, index: int) -> list[int]:
    """SIGKILL the node's kubelet and dockerd (its containerd follows; the containers' shims and
    processes live on, as on a machine whose agent died). kube-proxy stays."""
    pids = node_pids(layout)
    killed = []
    for name in (f"kubelet-{index}", f"dockerd-{index}"):
        pid = pids.get(name)
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    containerd_pid = layout.node_dir(index) / "dexec" / "containerd" / "containerd.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(containerd_pid.read_text())
        deadline = time.monotonic() + 15
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return killed


def start_node(layout: Layout, index: int, bins: Path) -> None:
    """Start a killed node's dockerd and kubelet again (the same data: images stay loaded)."""
    pids = node_pids(layout)
    if any(alive(pids.get(name, 0)) for name in (f"kubelet-{index}", f"dockerd-{index}")):
        raise ClusterError(f"node {index} is running; kill-node it first")
    start_node_runtime(layout, index, bins)


def image_id(docker: list[str], image: str) -> str:
    return run([*docker, "image", "inspect", "-f", "{{.Id}}", image], check=False).strip()


def load_images(layout: Layout, images: list[str]) -> dict[str, list[str]]:
    """`docker save` from the host's engine streamed into every node's `docker load` at once
    (no archive on disk), skipping nodes that already have the same image id. Returns the nodes
    loaded per image."""
    read_info(layout)
    loaded: dict[str, list[str]] = {}
    for image in images:
        wanted = image_id(["docker"], image)
        if not wanted:
            raise ClusterError(f"image {image} is not in the host's Docker engine")
        missing = [
            index for index in layout.node_indexes()
            if image_id(node_docker(layout, index), image) != wanted
        ]  # fmt: skip
        loaded[image] = [layout.node_name(index) for index in missing]
        if missing:
            stream_image(image, [node_docker(layout, index) for index in missing])
    return loaded


def stream_image(image: str, engines: list[list[str]]) -> None:
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    loaders = [
        subprocess.Popen(
            [*engine, "load", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for engine in engines
    ]
    assert save.stdout is not None
    try:
        while chunk := save.stdout.read(1 << 20):
            for loader in loaders:
                assert loader.stdin is not None
                loader.stdin.write(chunk)
    finally:
        for loader in loaders:
            assert loader.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                loader.stdin.close()
    errors = []
    for loader in loaders:
        assert loader.stderr is not None
        errors.append(loader.stderr.read().decode().strip())
        loader.wait()
    if save.wait() != 0:
        raise ClusterError(f"docker save {image} failed")
    for loader, error in zip(loaders, errors, strict=True):
        if loader.returncode:
            raise ClusterError(f"docker load of {image} failed: {error}")


def status(layout: Layout) -> dict[str, Any]:
    info = read_info(layout)
    info["processes"] = {name: alive(pid) for name, pid in node_pids(layout).items()}
    try:
        info["node_conditions"] = node_conditions(Api(layout))
    except (OSError, ClusterError, http.client.HTTPException, ssl.SSLError) as error:
        info["node_conditions"] = f"API server unreachable: {error}"
    info["memory_rss_mib"] = round(rss_bytes(cgroup_pids(layout)) / 2**20)
    return info


def shell_env(info: dict[str, Any]) -> str:
    nodes = info["nodes"]
    lines = {
        "KUBECONFIG": info["kubeconfig"],
        "ACS_KUBE_SLOT": str(info["slot"]),
        "ACS_KUBE_SERVER": info["server"],
        "ACS_KUBE_HOST_ADDRESS": info["host_address"],
        "ACS_KUBE_SERVICE_CIDR": info["service_cidr"],
        "ACS_KUBE_STORAGE_CLASS": info["storage_class"],
        "ACS_KUBE_NODES": " ".join(node["name"] for node in nodes),
        "ACS_KUBE_POD_CIDRS": " ".join(f"{n['name']}={n['pod_cidr']}" for n in nodes),
        "ACS_KUBE_DOCKER_HOSTS": " ".join(f"{n['name']}={n['docker_host']}" for n in nodes),
    }
    return "".join(f"export {key}='{value}'\n" for key, value in lines.items())
