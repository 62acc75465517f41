#!/usr/bin/env bash
# Build the control plane's own image from the Dockerfile at the repository root.
#
# Usage: scripts/build-control-plane-image.sh [--no-cache]
#   --no-cache   passed to docker build (rebuild every layer)
#
# Environment:
#   ACS_IMAGE          tag to build (default acs-control-plane:latest)
#   ACS_BASE_IMAGE     base image (default acs-base:bookworm). acs-base:bookworm is
#                      made by scripts/build-images.sh when it is missing (that also
#                      builds the sandbox images, which the control plane needs on
#                      the same host anyway); any other name is pulled. With a
#                      registry, debian:bookworm-slim works (python3 is then
#                      installed in the image with apt).
#
# What it does:
#   1. Base image (see ACS_BASE_IMAGE).
#   2. Wheels of the project's dependencies (pyproject.toml) for CPython 3.11
#      (bookworm's python3) on this machine's architecture, plus setuptools to
#      build the project itself, downloaded with pip on the host (nothing inside
#      `docker build` talks to PyPI). Versions are pinned to what .venv has
#      installed, so the image runs what the tests ran. They are downloaded into
#      $ACS_CACHE_DIR/control-plane-wheels/<key> (default ~/.cache/acs, which a fresh
#      clone finds again) only when the requirements or the pins change, and linked
#      into var/build/control-plane/wheels/ -- always under the repository, whatever
#      ACS_DATA_DIR says, because the build context is the repository root and
#      .dockerignore lets only that directory of var/ through.
#   3. `docker build --build-arg BASE_IMAGE=... -t $ACS_IMAGE .`; docker's layer
#      cache keeps an unchanged rebuild under a second, and a source-only change
#      to the last layers of the venv stage (~10 s). The venv stage is tagged
#      acs-control-plane-build:venv so that it stays cached while its older,
#      untagged versions are pruned.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

IMAGE=${ACS_IMAGE:-acs-control-plane:latest}
VENV_TAG=acs-control-plane-build:venv # the venv stage, kept as the layer cache
BASE_IMAGE=${ACS_BASE_IMAGE:-acs-base:bookworm}
LOCAL_BASE=acs-base:bookworm
WORK_DIR=$ROOT/var/build/control-plane
WHEEL_DIR=$WORK_DIR/wheels
WHEEL_CACHE=${ACS_CACHE_DIR:-$HOME/.cache/acs}/control-plane-wheels
LOG_DIR=$WORK_DIR/logs
IMAGE_PYTHON=3.11.2 # python3 of Debian bookworm, i.e. of the image
# pip download evaluates environment markers with the host's interpreter, not the
# target's: a dependency that only the image's 3.11.2 needs is listed here. (redis
# needs async-timeout when python_full_version < "3.11.3"; the host may be newer.)
# A missing one fails the image build loudly (the build installs with --no-index).
TARGET_ONLY=("async-timeout>=4.0.3")
KEY_SCHEMA=1      # bump to force a new download after a change to this script

log() { echo "build-control-plane-image: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

build_args=()
for arg in "$@"; do
    case "$arg" in
        --no-cache) build_args+=(--no-cache) ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument $arg (see --help)" ;;
    esac
done

docker info >/dev/null 2>&1 || die "docker is not usable; run scripts/install-docker.sh first"
mkdir -p "$WORK_DIR" "$LOG_DIR"

# One build at a time (make -j, parallel test runs).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$WORK_DIR/build.lock"
    flock 9
fi

TMP_DIRS=()
cleanup() {
    local dir
    for dir in "${TMP_DIRS[@]}"; do rm -rf "$dir"; done
}
trap cleanup EXIT

# --- 1. base image ------------------------------------------------------------

ensure_base_image() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        return
    fi
    if [ "$BASE_IMAGE" = "$LOCAL_BASE" ]; then
        log "$LOCAL_BASE is missing: making it with scripts/build-images.sh"
        scripts/build-images.sh >&2
    else
        log "pulling $BASE_IMAGE"
        docker pull -q "$BASE_IMAGE" >/dev/null ||
            die "base image $BASE_IMAGE is not present locally and cannot be pulled;" \
                "unset ACS_BASE_IMAGE to use the local $LOCAL_BASE"
    fi
}

# --- 2. wheels ----------------------------------------------------------------

py_tag() { echo "$IMAGE_PYTHON" | cut -d. -f1,2 | tr -d .; }

host_python() {
    local py
    for py in .venv/bin/python python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1 &&
            "$py" -c 'import tomllib' >/dev/null 2>&1; then
            echo "$py"
            return
        fi
    done
    die "no Python >= 3.11 with pip on this host (make install creates .venv)"
}

# The project's run-time requirements, one per line, from pyproject.toml.
requirements() {
    "$1" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
}

# Exact versions installed in .venv (name==version lines only), minus the build tools.
pins() {
    [ -x .venv/bin/python ] || return 0
    .venv/bin/python -m pip freeze --disable-pip-version-check --exclude-editable 2>/dev/null |
        grep -E '^[A-Za-z0-9_.-]+==' | grep -viE '^(pip|setuptools|wheel)==' || true
}

ensure_wheels() {
    local py arch reqs constraints key tmp
    py=$(host_python)
    arch=$(uname -m)
    reqs=$(requirements "$py")
    constraints=$(pins)
    key=$(printf 'schema %s\npython %s-%s\n%s\n--\n%s\n' "$KEY_SCHEMA" "$IMAGE_PYTHON" "$arch" \
        "$reqs ${TARGET_ONLY[*]}" "$constraints" | sha256sum | cut -c1-16)
    if [ -f "$WHEEL_DIR/.complete" ] && [ "$(cat "$WHEEL_DIR/.key" 2>/dev/null)" = "$key" ]; then
        return
    fi
    mkdir -p "$WHEEL_CACHE"
    if command -v flock >/dev/null 2>&1; then # clones share the cache
        exec 8>"$WHEEL_CACHE/.lock"
        flock 8
    fi
    if [ ! -f "$WHEEL_CACHE/$key/.complete" ]; then
        download_wheels "$py" "$arch" "$reqs" "$constraints" "$key"
    fi
    # Into the build context: hard links where the cache is on the same file system.
    tmp=$(mktemp -d "$WORK_DIR/wheels.tmp.XXXXXX")
    TMP_DIRS+=("$tmp")
    cp -al "$WHEEL_CACHE/$key/." "$tmp/" 2>/dev/null || cp -a "$WHEEL_CACHE/$key/." "$tmp/"
    rm -rf "$WHEEL_DIR"
    mv "$tmp" "$WHEEL_DIR"
}

download_wheels() {
    local py=$1 arch=$2 reqs=$3 constraints=$4 key=$5 tmp start v
    start=$(now)
    tmp=$(mktemp -d "$WHEEL_CACHE/.tmp.XXXXXX")
    TMP_DIRS+=("$tmp")
    printf '%s\n' "$reqs" >"$tmp/requirements.txt"
    printf '%s\n' "$constraints" >"$tmp/constraints.txt"
    # Binary wheels for the image's interpreter, whatever the host's Python is.
    local platforms=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch"
        --platform "manylinux1_$arch" --platform "linux_$arch")
    for v in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${v}_$arch"); done
    if ! "$py" -m pip download --disable-pip-version-check --only-binary=:all: \
        --implementation cp --python-version "$IMAGE_PYTHON" --abi "cp$(py_tag)" \
        "${platforms[@]}" -r "$tmp/requirements.txt" -c "$tmp/constraints.txt" \
        "${TARGET_ONLY[@]}" "setuptools>=68" -d "$tmp" >"$LOG_DIR/wheels.log" 2>&1; then
        tail -n 20 "$LOG_DIR/wheels.log" >&2
        die "downloading wheels failed (log: $LOG_DIR/wheels.log)"
    fi
    echo "$key" >"$tmp/.key"
    touch "$tmp/.complete"
    rm -rf "${WHEEL_CACHE:?}/$key"
    mv "$tmp" "$WHEEL_CACHE/$key"
    log "wheels downloaded in $(since "$start")s ($(find "$WHEEL_CACHE/$key" -name '*.whl' | wc -l) wheels)"
}

# --- 3. the image -------------------------------------------------------------

main() {
    local start log_file
    start=$(now)
    ensure_base_image
    ensure_wheels
    log_file="$LOG_DIR/build.log"
    # The venv stage first, tagged, so that it stays as the layer cache of the next build
    # while its older versions become untagged and can be pruned; then the image (the venv
    # stage comes from the cache).
    if ! {
        docker build --force-rm "${build_args[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
            --target venv -t "$VENV_TAG" . &&
            docker build --force-rm --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" .
    } >"$log_file" 2>&1; then
        tail -n 40 "$log_file" >&2
        die "building $IMAGE failed (full log: $log_file)"
    fi
    # Earlier builds of the image and of its venv stage, now untagged.
    docker image prune -f --filter "label=acs.image=control-plane" >/dev/null 2>&1 || true
    docker image prune -f --filter "label=acs.image=control-plane-venv" >/dev/null 2>&1 || true
    printf '%-12s %-36s %s\n' "image" "$IMAGE" "built in $(since "$start")s ($BASE_IMAGE)"
}

main
