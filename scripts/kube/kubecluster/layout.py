"""Names, paths, addresses and tuning of a cluster slot (docs/test-cluster.md lists them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "scripts" / "kube" / "build.sh"
SLOTS = 4
DEFAULT_NODES = 2
MAX_NODES = 8
PAUSE_IMAGE = "acs-kube-pause:3.4"
STORAGE_CLASS = "acs-hostpath"
API_PORT = 6443
# A node whose kubelet stops renewing its lease is NotReady after the grace period (checked every
# monitor period); its pods are then marked not Ready. The kubelet renews its lease every quarter
# of the lease duration and posts its status every NODE_STATUS_UPDATE_S.
NODE_MONITOR_PERIOD_S = 2
NODE_MONITOR_GRACE_S = 10
NODE_LEASE_DURATION_S = 8
NODE_STATUS_UPDATE_S = 2
CGROUP_FS = Path("/sys/fs/cgroup")
POD_LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
SHIM_SOCKET_DIR = Path("/run/containerd/s")  # fixed in containerd; shared with the host's engine
UP_TIMEOUT_S = 120.0
# The tmpfs's size limit (memory is only used as files are written): every image loaded costs its
# size once per node. ACS_KUBE_ENGINE_STORE=disk keeps the nodes' images on disk instead.
MEMORY_STORE_SIZE = os.environ.get("ACS_KUBE_MEMORY_STORE_SIZE", "8g")
ENGINE_STORE = os.environ.get("ACS_KUBE_ENGINE_STORE", "memory")
# Lock files live with the cached binaries (which every cluster needs anyway), not in /tmp.
CACHE = Path(
    os.environ.get("ACS_KUBE_CACHE")
    or Path(os.environ.get("ACS_CACHE_DIR") or Path.home() / ".cache" / "acs") / "kubernetes"
)
GLOBAL_LOCK = CACHE / "slots.lock"


@dataclass(frozen=True)
class Layout:
    """Names, paths and addresses of one cluster slot; nodes are numbered from 1."""

    slot: int
    nodes: int = DEFAULT_NODES

    @property
    def prefix(self) -> str:
        return f"acsk{self.slot}"

    @property
    def net(self) -> str:
        return f"10.{240 + self.slot}"

    @property
    def state_dir(self) -> Path:
        # Under /tmp: unix socket paths must stay short, and the hostPath provisioner only deletes
        # volumes below /tmp.
        return Path(f"/tmp/acs-kube-{self.slot}")

    @property
    def memory_dir(self) -> Path:
        """A tmpfs of the cluster's own (MEMORY_STORE_SIZE at most): etcd's data, which it fsyncs
        on every write (seconds on a loaded disk), and the nodes' Docker data roots, whose tens of
        thousands of image files took 30 s and more to delete from the disk of a busy host."""
        return self.state_dir / "memory"

    @property
    def etcd_dir(self) -> Path:
        return self.memory_dir / "etcd"

    def docker_root(self, index: int) -> Path:
        if ENGINE_STORE == "disk":
            return self.node_dir(index) / "docker"
        return self.memory_dir / f"docker-{index}"

    @property
    def volumes_dir(self) -> Path:
        return self.state_dir / "volumes"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def info_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def owner_file(self) -> Path:
        return self.state_dir / "owner.json"

    @property
    def lock_file(self) -> Path:
        return CACHE / f"slot-{self.slot}.lock"

    @property
    def host_ip(self) -> str:
        return f"{self.net}.0.1"

    @property
    def api_ip(self) -> str:
        return f"{self.net}.0.2"

    @property
    def link_cidr(self) -> str:
        return f"{self.net}.0.0/24"

    @property
    def cluster_cidr(self) -> str:
        return f"{self.net}.16.0/20"

    @property
    def service_cidr(self) -> str:
        return f"{self.net}.32.0/20"

    @property
    def api_service_ip(self) -> str:
        return f"{self.net}.32.1"

    @property
    def server(self) -> str:
        return f"https://{self.api_ip}:{API_PORT}"

    @property
    def host_veth(self) -> str:
        return f"{self.prefix}h"

    @property
    def cgroup(self) -> str:
        return f"/{self.prefix}"

    def netns(self, name: str) -> Path:
        return self.state_dir / "netns" / name

    def node_name(self, index: int) -> str:
        return f"node-{index}"

    def node_ip(self, index: int) -> str:
        return f"{self.net}.0.{10 + index}"

    def pod_cidr(self, index: int) -> str:
        return f"{self.net}.{15 + index}.0/24"

    def pod_gateway(self, index: int) -> str:
        return f"{self.net}.{15 + index}.1"

    def node_dir(self, index: int) -> Path:
        return self.state_dir / f"n{index}"

    def docker_socket(self, index: int) -> Path:
        return self.node_dir(index) / "docker.sock"

    def node_indexes(self) -> range:
        return range(1, self.nodes + 1)
