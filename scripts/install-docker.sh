#!/usr/bin/env bash
# Make sure a working Docker daemon is available on this host.
#
# Idempotent:
#   * `docker info` already works        -> exit 0
#   * root on Debian/Ubuntu, no dockerd  -> apt-get install docker.io
#   * dockerd installed but not running  -> start it in the background
#     (no systemd here: nohup setsid dockerd > $DOCKERD_LOG 2>&1 &)
#     and wait up to $DOCKER_WAIT_SECONDS (60) for `docker info`.
#   * not root                           -> print what to install, exit 1
#
# Env: DOCKERD_LOG (default /var/log/dockerd.log), DOCKER_WAIT_SECONDS (60).
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
WAIT="${DOCKER_WAIT_SECONDS:-60}"

log() { echo "install-docker: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

docker_ok() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

if docker_ok; then
    log "docker is already working ($(docker info --format '{{.ServerVersion}} / {{.Driver}}' 2>/dev/null))"
    exit 0
fi

is_debian=0
if [ -r /etc/os-release ] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; then
    is_debian=1
fi

if [ "$(id -u)" -ne 0 ]; then
    cat >&2 <<'MSG'
install-docker: ERROR: Docker is not usable and this script is not running as root.
Please install and start Docker yourself, e.g. on Debian/Ubuntu:
    sudo apt-get update && sudo apt-get install -y docker.io
    sudo systemctl enable --now docker      # or: sudo dockerd &
    sudo usermod -aG docker "$USER"         # then log in again
Then check that `docker info` works and re-run.
MSG
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    [ "$is_debian" -eq 1 ] || die "dockerd is not installed and this is not a Debian-like system; install Docker manually"
    log "installing docker.io via apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends docker.io iptables nftables ca-certificates
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd is already running, waiting for it to answer"
else
    log "starting dockerd in the background (log: $DOCKERD_LOG)"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    # containerd/dockerd pid files from a previous, killed run would block start-up.
    if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
        rm -f /var/run/docker.pid
    fi
    # setsid + nohup: dockerd must outlive the calling shell / make.
    nohup setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
fi

for _ in $(seq 1 "$WAIT"); do
    if docker_ok; then
        log "docker is ready ($(docker info --format '{{.ServerVersion}} / storage driver {{.Driver}}' 2>/dev/null))"
        exit 0
    fi
    sleep 1
done

log "last lines of $DOCKERD_LOG:"
tail -n 20 "$DOCKERD_LOG" >&2 || true
die "dockerd did not become ready within ${WAIT}s (see $DOCKERD_LOG)"
