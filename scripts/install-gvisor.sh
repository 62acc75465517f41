#!/usr/bin/env bash
# Make gVisor's `runsc` available to the Docker engine as the runtime "runsc", for specs that set
# `runtime: runsc` (docs/sandboxes.md, docs/security.md). Optional: every failure is reported and
# the script still exits 0, so `make run` and `make test` work without it (the gVisor test then
# skips and says why).
#
# Idempotent:
#   * `docker info` already lists runsc        -> nothing to do
#   * runsc missing, root on Debian            -> apt-get install runsc
#   * /etc/docker/daemon.json                  -> merged: runtimes.runsc is added (other keys and
#                                                 runtimes are kept), with runtimeArgs
#                                                 ["--network=host"]: runsc's own network stack
#                                                 fails on this engine ("cannot run with network
#                                                 enabled in root network namespace")
#   * dockerd                                  -> SIGHUP: it reloads `runtimes` without a restart
#                                                 (never restarted: other work shares the engine)
#
# Env: DOCKER_DAEMON_JSON (default /etc/docker/daemon.json).
set -uo pipefail

DAEMON_JSON="${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"
log() { echo "install-gvisor: $*" >&2; }

has_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if has_runtime; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    log "the Docker engine has no runsc runtime and this is not root; skipping (gVisor specs will not start)."
    log "to enable it: sudo apt-get install runsc && sudo $0"
    exit 0
fi

runsc_path=$(command -v runsc || true)
if [ -z "$runsc_path" ]; then
    if command -v apt-get >/dev/null 2>&1 && apt-cache show runsc >/dev/null 2>&1; then
        log "installing Debian's runsc package"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runsc >/dev/null \
            || log "apt-get install runsc failed"
    fi
    runsc_path=$(command -v runsc || true)
fi
if [ -z "$runsc_path" ]; then
    log "runsc is not installable here (no Debian package); gVisor specs will not start"
    exit 0
fi

mkdir -p "$(dirname "$DAEMON_JSON")"
if ! python3 - "$DAEMON_JSON" "$runsc_path" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
config = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        config = json.load(f)  # a broken file is left alone: the error goes to the log
wanted = {"path": runsc, "runtimeArgs": ["--network=host"]}
runtimes = config.setdefault("runtimes", {})
if runtimes.get("runsc") != wanted:
    runtimes["runsc"] = wanted
    tmp = path + ".acs-tmp"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"install-gvisor: registered runsc in {path}", file=sys.stderr)
PY
then
    log "could not update $DAEMON_JSON; gVisor specs will not start"
    exit 0
fi

pid=""
[ -r /var/run/docker.pid ] && pid=$(cat /var/run/docker.pid)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    pid=$(pgrep -x dockerd | head -n 1 || true)
fi
if [ -z "$pid" ]; then
    log "dockerd is not running; it reads $DAEMON_JSON when it starts"
    exit 0
fi
kill -HUP "$pid"
for _ in $(seq 1 20); do
    if has_runtime; then
        log "the engine now offers the runsc runtime"
        exit 0
    fi
    sleep 0.5
done
log "dockerd did not pick up runsc after SIGHUP; see its log"
exit 0
