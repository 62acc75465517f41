#!/usr/bin/env bash
# Prepares a Debian host for `make run` and `make test`: Python venv support, redis-server,
# haproxy (the high-availability tests' balancer), debootstrap, docker-registry (the snapshot
# store of the tests), a running Docker engine, and
# gVisor's runsc registered with it (optional); with --browser, Python venv support, Debian's
# chromium and npm (the browser tests, and the web apps they fetch from the npm registry) only;
# with --unit, Python venv support, redis-server and npm (Node runs the tests' OpenID provider)
# only (make test-unit); with --kube, what the Kubernetes test cluster needs
# (docs/test-cluster.md): what scripts/kube/build.sh calls to build it from Debian's source
# package (Go and the reflect2 sources, dpkg-source, xz, patch, make, rsync, gcc for the pause
# binary) and what scripts/kube-cluster.sh runs it with (etcd-server, conntrack, iproute2,
# openssl); with --clients, the Python versions of the OpenHands client venvs
# (tests/support/openhands_clients.py): says where each comes from and installs what it can.
# Installs what is missing when run as root on Debian; otherwise says exactly what to install.
# Safe to run again: it only acts on what is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

python_only=false
browser=false
redis_only=false
kube=false
case "${1:-}" in
    --python-only) python_only=true ;;
    --browser) python_only=true; browser=true ;;
    --unit) python_only=true; redis_only=true ;;
    --kube) python_only=true; kube=true ;;
    --clients) exec scripts/install-pythons.sh ;;
esac

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }

python3 - <<'PY' || { echo "bootstrap: Python >= 3.11 is required (found $(python3 --version 2>&1))" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if ! $python_only; then
    have redis-server || need_apt+=(redis-server)
    # The balancer in front of several replicas in the high-availability tests (tests/balancer.py).
    have haproxy || need_apt+=(haproxy)
    have debootstrap || need_apt+=(debootstrap)
    # The distribution registry (OCI v2) the snapshot tests store into, started by their fixture
    # (tests/support/registry_server.py) like redis-server; Debian's package would start a
    # service of its own on :5000, which nothing here uses.
    have docker-registry || need_apt+=(docker-registry)
    # The host firewall's outbound fence of sandbox networks (drivers/docker/firewall.py).
    have nft || need_apt+=(nftables)
fi
if $browser; then
    have chromium || need_apt+=(chromium)
    have npm || need_apt+=(npm)
fi
if $redis_only; then
    have redis-server || need_apt+=(redis-server)
    # The OpenID provider of the sign-in tests (tests/support/oidc_provider.py) runs on Node.
    have npm || need_apt+=(npm)
fi
if $kube; then
    # scripts/kube/build.sh (its tool check lists the same).
    have go || need_apt+=(golang-go)
    have gcc || need_apt+=(gcc libc6-dev)
    have rsync || need_apt+=(rsync)
    have make || need_apt+=(make)
    have patch || need_apt+=(patch)
    have dpkg-source || need_apt+=(dpkg-dev)
    have xz || need_apt+=(xz-utils)
    [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] ||
        need_apt+=(golang-github-modern-go-reflect2-dev)
    # scripts/kube-cluster.sh (and the engine of `make host`, which runs each node's dockerd).
    have etcd || need_apt+=(etcd-server)
    have conntrack || need_apt+=(conntrack)
    have ip || need_apt+=(iproute2)
    have openssl || need_apt+=(openssl)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && have apt-get; then
        echo "bootstrap: installing ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "bootstrap: missing ${need_apt[*]}; install them with: sudo apt-get install ${need_apt[*]}" >&2
        exit 1
    fi
fi

$python_only && exit 0
scripts/install-docker.sh
# gVisor for specs with `runtime: runsc`: optional, never fails the set-up.
scripts/install-gvisor.sh
