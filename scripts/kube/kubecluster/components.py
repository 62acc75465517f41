"""Starting etcd, the control-plane components and each node's dockerd, kubelet and kube-proxy."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from kubecluster.host import in_netns, log_tail, run, spawn, wait_for
from kubecluster.layout import (
    API_PORT,
    NODE_MONITOR_GRACE_S,
    NODE_MONITOR_PERIOD_S,
    PAUSE_IMAGE,
    Layout,
)


def start_etcd(layout: Layout) -> None:
    layout.etcd_dir.mkdir(parents=True)
    spawn(
        layout,
        "etcd",
        [
            "etcd", "--name", "acs-kube", "--data-dir", str(layout.etcd_dir),
            "--listen-client-urls", "http://127.0.0.1:2379",
            "--advertise-client-urls", "http://127.0.0.1:2379",
            "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "acs-kube=http://127.0.0.1:2380",
            "--heartbeat-interval", "50", "--election-timeout", "250",
            "--logger", "zap", "--log-level", "warn",
        ],
        netns=layout.netns("ctl"),
        cgroup=f"{layout.cgroup}/ctl",
    )  # fmt: skip


def etcd_healthy(layout: Layout) -> bool:
    # etcd listens inside the control namespace: ask from there.
    out = run(
        in_netns(layout.netns("ctl"), ["curl", "-s", "http://127.0.0.1:2379/health"]), check=False
    )
    return '"health":"true"' in out


def start_apiserver(layout: Layout, bins: Path) -> None:
    state, pki, ctl = layout.state_dir, layout.state_dir / "pki", layout.netns("ctl")
    cgroup = f"{layout.cgroup}/ctl"
    spawn(
        layout,
        "kube-apiserver",
        [
            str(bins / "kube-apiserver"),
            "--etcd-servers=http://127.0.0.1:2379",
            f"--bind-address={layout.api_ip}",
            f"--advertise-address={layout.api_ip}",
            f"--secure-port={API_PORT}",
            "--insecure-port=0",
            f"--service-cluster-ip-range={layout.service_cidr}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--cert-dir={state / 'ctl' / 'apiserver'}",
            "--profiling=false",
            "--v=1",
        ],
        netns=ctl,
        cgroup=cgroup,
    )


def start_controllers(layout: Layout, bins: Path) -> None:
    """The controller manager and the scheduler, once the API server is ready (the controller
    manager gives up on an API server that is not healthy within 10 s). Neither serves HTTP(S)
    (--port=0 --secure-port=0): nothing here reads their health or metrics, and each would
    first make itself an RSA certificate (a second on a busy host)."""
    state, pki, ctl = layout.state_dir, layout.state_dir / "pki", layout.netns("ctl")
    cgroup = f"{layout.cgroup}/ctl"
    common = ["--port=0", "--secure-port=0", "--leader-elect=false", "--profiling=false", "--v=1"]
    cm_kubeconfig = state / "controller-manager.kubeconfig"
    spawn(
        layout,
        "kube-controller-manager",
        [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={cm_kubeconfig}",
            *common,
            # One identity (in system:masters, scripts/kube/kubecluster/pki.py) for every
            # controller: a service account per controller, as kubeadm sets up, costs 3 s of
            # token round trips at every bring-up.
            "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--node-monitor-period={NODE_MONITOR_PERIOD_S}s",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
            "--enable-hostpath-provisioner=true",
            # Not /usr/libexec/kubernetes, which its FlexVolume prober would create.
            f"--flex-volume-plugin-dir={state / 'ctl' / 'volume-plugins'}",
            "--allocate-node-cidrs=false",
        ],
        netns=ctl,
        cgroup=cgroup,
        env={"HOSTPATH_PROVISIONER_DIR": str(layout.volumes_dir)},  # scripts/kube/patches/04
    )
    sched_kubeconfig = state / "scheduler.kubeconfig"
    spawn(
        layout,
        "kube-scheduler",
        [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={sched_kubeconfig}",
            *common,
        ],
        netns=ctl,
        cgroup=cgroup,
    )


def node_docker(layout: Layout, index: int) -> list[str]:
    return ["docker", "-H", f"unix://{layout.docker_socket(index)}"]


def start_dockerd(layout: Layout, index: int) -> None:
    node = layout.node_dir(index)
    spawn(
        layout,
        f"dockerd-{index}",
        [
            "dockerd",
            "--config-file", str(node / "daemon.json"),
            "-H", f"unix://{layout.docker_socket(index)}",
            "--data-root", str(layout.docker_root(index)),
            "--exec-root", str(node / "dexec"),
            "--pidfile", str(node / "docker.pid"),
            # The default bridge is made in the node's namespace (never --bridge=none: in the
            # host namespace that deletes docker0); pods get addresses from it.
            f"--bip={layout.pod_gateway(index)}/24",
            "--iptables=false", "--ip6tables=false", "--ip-masq=false",
            f"--cgroup-parent={layout.cgroup}/n{index}/docker",
            "--exec-opt", "native.cgroupdriver=cgroupfs",
            "--oom-score-adjust=0",
            "--log-driver=json-file", "--log-opt", "max-size=10m",
        ],
        netns=layout.netns(f"n{index}"),
        cgroup=f"{layout.cgroup}/n{index}/system",
    )  # fmt: skip


def docker_answers(layout: Layout, index: int) -> bool:
    # The exit status, not the output: without a daemon the client still prints a blank line.
    version = [*node_docker(layout, index), "version", "-f", "{{.Server.Version}}"]
    return subprocess.run(version, capture_output=True, check=False).returncode == 0


def load_pause_image(layout: Layout, index: int, bins: Path) -> None:
    """The pod sandbox image: the static pause binary alone (there is no registry)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(bins / "pause", arcname="pause")
    run(
        [
            *node_docker(layout, index),
            "import",
            "--change",
            'ENTRYPOINT ["/pause"]',
            "-",
            PAUSE_IMAGE,
        ],
        stdin=buffer.getvalue(),
    )


def start_kubelet(layout: Layout, index: int, bins: Path) -> None:
    node = layout.node_dir(index)
    spawn(
        layout,
        f"kubelet-{index}",
        [
            str(bins / "kubelet"),
            f"--config={node / 'kubelet.json'}",
            f"--kubeconfig={node / 'kubelet.kubeconfig'}",
            f"--hostname-override={layout.node_name(index)}",
            f"--node-ip={layout.node_ip(index)}",
            "--container-runtime=docker",
            f"--docker-endpoint=unix://{layout.docker_socket(index)}",
            # Every path the kubelet would otherwise share with other kubelets or the host:
            f"--container-runtime-endpoint=unix://{node / 'dockershim.sock'}",
            f"--experimental-dockershim-root-directory={node / 'dockershim'}",
            f"--root-dir={node / 'kubelet'}",
            f"--cert-dir={node / 'kubelet-pki'}",
            f"--volume-plugin-dir={node / 'volume-plugins'}",
            f"--pod-infra-container-image={PAUSE_IMAGE}",
            # cAdvisor's view of the runtime: this node's engine, not the host's.
            f"--docker=unix://{layout.docker_socket(index)}",
            f"--docker-root={layout.docker_root(index)}",
            f"--containerd={node / 'dexec' / 'containerd' / 'containerd.sock'}",
            "--v=1",
        ],
        netns=layout.netns(f"n{index}"),
        cgroup=f"{layout.cgroup}/n{index}/system",
    )


def start_kube_proxy(layout: Layout, index: int, bins: Path) -> None:
    spawn(
        layout,
        f"kube-proxy-{index}",
        [
            str(bins / "kube-proxy"),
            f"--config={layout.node_dir(index) / 'kube-proxy.json'}",
            "--v=1",
        ],
        netns=layout.netns(f"n{index}"),
        cgroup=f"{layout.cgroup}/n{index}/system",
    )


def start_node_runtime(layout: Layout, index: int, bins: Path) -> None:
    """dockerd, then (once it answers, with the pause image in it) the kubelet."""
    start_dockerd(layout, index)
    wait_for(
        f"dockerd of node {index}",
        lambda: docker_answers(layout, index),
        30,
        diagnose=lambda: log_tail(layout, f"dockerd-{index}"),
    )
    load_pause_image(layout, index, bins)
    start_kubelet(layout, index, bins)
