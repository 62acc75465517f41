"""Kubeconfigs and the kubelet's and kube-proxy's configuration files of one cluster."""

from __future__ import annotations

from kubecluster.host import write_json
from kubecluster.layout import NODE_LEASE_DURATION_S, NODE_STATUS_UPDATE_S, Layout
from kubecluster.pki import kubeconfig


def write_configs(layout: Layout) -> None:
    state = layout.state_dir
    pki = state / "pki"
    write_json(layout.kubeconfig, kubeconfig(layout, "admin", embed=True))
    for user in ("controller-manager", "scheduler", "kube-proxy"):
        write_json(state / f"{user}.kubeconfig", kubeconfig(layout, user))
    # No cluster DNS: a nameserver that refuses at once (the host's bridge address, where
    # nothing listens on port 53), rather than the host's, which a node cannot reach (time-outs).
    (state / "resolv.conf").write_text(
        f"nameserver {layout.host_ip}\noptions timeout:1 attempts:1\n"
    )
    for index in layout.node_indexes():
        node = layout.node_dir(index)
        write_json(node / "kubelet.kubeconfig", kubeconfig(layout, f"kubelet-{index}"))
        write_json(node / "daemon.json", {})  # never /etc/docker/daemon.json
        write_json(
            node / "kubelet.json",
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": layout.node_ip(index),
                "port": 10250,
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": 10248,
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": False},
                    "x509": {"clientCAFile": str(pki / "ca.crt")},
                },
                # Only holders of a certificate from this cluster's CA reach the kubelet at all
                # (the API server for logs and exec): no per-request authorization.
                "authorization": {"mode": "AlwaysAllow"},
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": f"{layout.cgroup}/n{index}",
                "cgroupsPerQOS": True,
                "enforceNodeAllocatable": ["pods"],
                "failSwapOn": False,
                "hairpinMode": "none",  # sysfs here is the host's: veth ports are not visible
                "resolvConf": str(state / "resolv.conf"),
                "nodeStatusUpdateFrequency": f"{NODE_STATUS_UPDATE_S}s",
                "nodeLeaseDurationSeconds": NODE_LEASE_DURATION_S,
                "syncFrequency": "10s",
                # Two kubelets see the same host disk and memory: evict only when nearly full,
                # never collect images (they were loaded, there is no registry to pull again).
                "evictionHard": {
                    "memory.available": "100Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                    "nodefs.inodesFree": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "oomScoreAdj": 0,
                "serializeImagePulls": False,
                "staticPodPath": "",
                # The device manager's socket directory is fixed (/var/lib/kubelet/device-plugins)
                # and wiped by every kubelet that starts: off, as no test node has devices.
                "featureGates": {"DevicePlugins": False},
            },
        )
        write_json(
            node / "kube-proxy.json",
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "clientConnection": {"kubeconfig": str(state / "kube-proxy.kubeconfig")},
                "hostnameOverride": layout.node_name(index),
                "bindAddress": layout.node_ip(index),
                "clusterCIDR": layout.cluster_cidr,
                "mode": "iptables",
                # 0: leave the host-wide conntrack table size and time-outs alone.
                "conntrack": {
                    "maxPerCore": 0,
                    "min": 0,
                    "tcpEstablishedTimeout": "0s",
                    "tcpCloseWaitTimeout": "0s",
                },
                "oomScoreAdj": 0,
                "healthzBindAddress": "127.0.0.1:10256",
                "metricsBindAddress": "127.0.0.1:10249",
            },
        )
