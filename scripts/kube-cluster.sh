#!/usr/bin/env bash
# The project's Kubernetes test cluster on this machine (docs/test-cluster.md): Kubernetes v1.20.2
# built from Debian's source package, etcd, the control plane and two nodes (each a network
# namespace with its own dockerd, a kubelet and kube-proxy). Run as root.
#
# Usage: scripts/kube-cluster.sh [--slot N] COMMAND [ARGS]
#   build                 build the binaries once (cached in ${ACS_KUBE_CACHE:-~/.cache/acs/kubernetes})
#   up [--nodes N]        bring a cluster up (first clearing what a killed run of the slot left)
#   down                  remove everything the cluster made
#   env [--json]          shell exports for clients (KUBECONFIG, API server, nodes, pod CIDRs, the
#                         host's address as pods see it); --json for programs
#   status                processes, node conditions, memory in use (JSON)
#   load-image IMAGE...   copy images from the host's engine into every node (docker save | load)
#   kill-node N           SIGKILL node N's kubelet and dockerd (a lost node)
#   start-node N          start a killed node's dockerd and kubelet again
# --slot N (0-3, default $ACS_KUBE_SLOT or 0): which of the clusters that can exist at once; slot N
# uses 10.(240+N).0.0/16. `eval "$(scripts/kube-cluster.sh env)"` then `kubectl get nodes`
# (kubectl is in the binaries' directory: `scripts/kube/build.sh` prints it).
set -euo pipefail
cd "$(dirname "$0")/.."

args=("$@")
command=""
for arg in "$@"; do
    case "$arg" in
        --slot | --slot=* | [0-9]*) ;;
        -*) ;;
        *)
            command=$arg
            break
            ;;
    esac
done
case "$command" in
    build) exec scripts/kube/build.sh ;;
    "" | help)
        sed -n '2,/^set -e/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
        [ -n "$command" ]
        ;;
    *) PYTHONPATH=scripts/kube exec python3 -m kubecluster "${args[@]}" ;;
esac
