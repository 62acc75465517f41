#!/usr/bin/env bash
# Build the sandbox images locally, incrementally.
#
# Usage: scripts/build-images.sh [--force] [SPEC_ID...]
#   SPEC_ID   build only these specs (id, or file name without .yaml), enabled or not;
#             default: every enabled spec (`enabled: false` specs only when named in
#             ACS_ENABLE_SPECS, as the control plane loads them)
#   --force   rebuild even when an image is up to date
#
# Environment:
#   ACS_BASE_IMAGE     base image of the bookworm sandbox images (default acs-base:bookworm).
#                      If it exists locally it is used as is. acs-base:bookworm is
#                      otherwise made here with debootstrap (root, ~1 min); any
#                      other name is pulled with `docker pull`.
#   ACS_BASE_IMAGE_TRIXIE  the same for specs whose build.debian is trixie
#                      (default acs-base:trixie, made with debootstrap likewise).
#   ACS_ENABLE_SPECS   comma-separated ids of `enabled: false` specs to build too.
#   ACS_DATA_DIR       where build files go (default ./var); this script uses
#                      $ACS_DATA_DIR/build: logs/, temp dirs.
#   ACS_CACHE_DIR      what outlives a clone (default ~/.cache/acs): wheels/, the
#                      downloaded wheels, which a fresh clone finds again.
#   ACS_IMAGE_TAG      tag for every spec image instead of the spec's own (the control
#                      plane reads the same variable), so that several checkouts can
#                      share one engine.
#   ACS_DEBIAN_MIRROR  Debian mirror for debootstrap and the base image's apt
#                      sources (default http://deb.debian.org/debian).
#
# What it does:
#   1. Base image of each Debian release the selected specs use (build.debian,
#      default bookworm; see ACS_BASE_IMAGE).
#   2. Wheels of the spec's build.requirements (default agent/requirements.txt) for
#      the spec's build.python (default 3.11, bookworm's python3) on this machine's
#      architecture, downloaded once with pip on the host and cached in
#      $ACS_CACHE_DIR/wheels/<hash of python, arch and requirements>/.
#      Requirement lines marked `# acs: no-wheel` (a package with no wheel on the
#      index) are built first with `pip wheel` on the host.
#   3. For every selected specs/*.yaml (or .yml) with a `build:` section: assemble a
#      build context in a temp dir -- specs/<build.context>/* (the Dockerfile), common/
#      (specs/images/common), agent/ (the package), wheels/, requirements.txt --
#      and `docker build --build-arg BASE_IMAGE=<base> -t <image>` it.
#      The sha256 of that context plus the base image ID is stored as image
#      label acs.content_hash; an image whose label matches is not rebuilt.
#
# Spec parsing: with a Python that has PyYAML (.venv/bin/python, else python3)
# the specs are read with yaml.safe_load. Without one, a small awk parser reads
# only these fields, which must then be written plainly, one per line:
#     id: NAME     image: NAME:TAG     enabled: BOOL
#     build:\n  context: DIR\n  debian: SUITE\n  python: X.Y\n  requirements: FILE
# (values may be quoted and followed by a # comment; no flow style, anchors or
# multi-line strings for these three fields).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

BASE_IMAGE=${ACS_BASE_IMAGE:-acs-base:bookworm}
IMAGE_TAG=${ACS_IMAGE_TAG:-}
DATA_DIR=${ACS_DATA_DIR:-./var}
case "$DATA_DIR" in /*) ;; *) DATA_DIR="$ROOT/${DATA_DIR#./}" ;; esac
BUILD_DIR="$DATA_DIR/build"
CACHE_DIR=${ACS_CACHE_DIR:-$HOME/.cache/acs}
WHEEL_CACHE="$CACHE_DIR/wheels"
LOG_DIR="$BUILD_DIR/logs"
MIRROR=${ACS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=http://deb.debian.org/debian-security
LABEL=acs.content_hash
COMMON_DIR=specs/images/common
REQUIREMENTS=agent/requirements.txt
HASH_SCHEMA=1 # bump to force a rebuild of every image after a layout change
ENABLE_SPECS=",${ACS_ENABLE_SPECS:-},"

log() { echo "build-images: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

force=0
selected=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
            exit 0
            ;;
        -*) die "unknown option $arg (see --help)" ;;
        *) selected+=("$arg") ;;
    esac
done

docker info >/dev/null 2>&1 || die "docker is not usable; run scripts/install-docker.sh first"
mkdir -p "$WHEEL_CACHE" "$LOG_DIR"

# One build at a time per data dir (make -j, parallel test runs).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$BUILD_DIR/build-images.lock"
    flock 9
fi

TMP_DIRS=()
cleanup() {
    local dir
    for dir in "${TMP_DIRS[@]}"; do
        [ -d "$dir" ] || continue
        # Unmount whatever an interrupted debootstrap left mounted (deepest first),
        # and never let rm cross into another file system.
        awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts 2>/dev/null |
            sort -r | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
        rm -rf --one-file-system "$dir"
    done
}
trap cleanup EXIT

package_list() { sed -e 's/#.*//' "$1" | tr -s ' \t\n' '\n' | sed '/^$/d'; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# --- 1. base image ----------------------------------------------------------

customize_rootfs() {
    local r=$1 suite=$2
    cat >"$r/etc/apt/sources.list" <<EOF
deb $MIRROR $suite main
deb $MIRROR $suite-updates main
deb $SECURITY_MIRROR $suite-security main
EOF
    # As in Debian's official container images: no services started by apt,
    # no recommends, no docs/man pages/translations in later installs.
    printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
    chmod 755 "$r/usr/sbin/policy-rc.d"
    cat >"$r/etc/apt/apt.conf.d/90acs" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
    cat >"$r/etc/dpkg/dpkg.cfg.d/90acs-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/*
    find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/*
    rm -rf "$r"/var/log/apt/* "$r"/var/log/*.log "$r/debootstrap"
    : >"$r/etc/resolv.conf"
    echo localhost >"$r/etc/hostname"
}

make_local_base() {
    local suite=$1 local_base="acs-base:$1"
    [ "$(id -u)" -eq 0 ] || die "creating $local_base needs root (debootstrap); run as root," \
        "or set ACS_BASE_IMAGE (bookworm) / ACS_BASE_IMAGE_TRIXIE to an image you have"
    command -v debootstrap >/dev/null 2>&1 ||
        die "debootstrap is missing: apt-get install debootstrap (or run scripts/bootstrap-host.sh)"
    local start work include
    start=$(now)
    work=$(mktemp -d "$BUILD_DIR/base.XXXXXX")
    TMP_DIRS+=("$work")
    include=$(package_list "$COMMON_DIR/base-packages.txt" | paste -sd, -)
    log "creating $local_base with debootstrap (log: $LOG_DIR/debootstrap-$suite.log)"
    if ! debootstrap --variant=minbase --include="$include" "$suite" "$work/rootfs" "$MIRROR" \
        >"$LOG_DIR/debootstrap-$suite.log" 2>&1; then
        tail -n 30 "$LOG_DIR/debootstrap-$suite.log" >&2
        die "debootstrap failed (full log: $LOG_DIR/debootstrap-$suite.log)"
    fi
    customize_rootfs "$work/rootfs" "$suite"
    tar --numeric-owner -C "$work/rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL acs.base=debootstrap-$suite-minbase" \
        --message "debootstrap --variant=minbase $suite + $include" \
        - "$local_base" >/dev/null
    cleanup
    TMP_DIRS=()
    printf '%-12s %-36s %s\n' "base" "$local_base" "created in $(since "$start")s"
}

# The base image of a Debian release: ACS_BASE_IMAGE for bookworm, ACS_BASE_IMAGE_<SUITE>
# otherwise, else our debootstrapped acs-base:<suite>.
base_image_for() {
    local suite=$1 var
    if [ "$suite" = bookworm ]; then
        echo "$BASE_IMAGE"
        return
    fi
    var="ACS_BASE_IMAGE_$(echo "$suite" | tr '[:lower:]' '[:upper:]')"
    echo "${!var:-acs-base:$suite}"
}

ensure_base_image() {
    local suite=$1 image
    image=$(base_image_for "$suite")
    if image_exists "$image"; then
        printf '%-12s %-36s %s\n' "base" "$image" "present"
    elif [ "$image" = "acs-base:$suite" ]; then
        make_local_base "$suite"
    else
        local start
        start=$(now)
        log "pulling $image"
        docker pull -q "$image" >/dev/null 2>"$LOG_DIR/pull.log" || {
            cat "$LOG_DIR/pull.log" >&2
            die "base image $image is not present locally and cannot be pulled;" \
                "unset ACS_BASE_IMAGE(_${suite^^}) to build the local acs-base:$suite with debootstrap"
        }
        printf '%-12s %-36s %s\n' "base" "$image" "pulled in $(since "$start")s"
    fi
}

# --- 2. wheels for the agent's venv -----------------------------------------

host_pip() {
    local py
    for py in .venv/bin/python python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
            echo "$py"
            return
        fi
    done
    # No pip anywhere: a private venv just for downloading wheels.
    if [ ! -x "$BUILD_DIR/pip-venv/bin/python" ]; then
        python3 -m venv "$BUILD_DIR/pip-venv" >&2 || die "python3 -m venv failed (apt-get install python3-venv)"
    fi
    echo "$BUILD_DIR/pip-venv/bin/python"
}

# The newest glibc of a Debian release: the newest manylinux tag its images can load.
glibc_of() {
    case "$1" in
        bookworm) echo 36 ;;
        trixie) echo 41 ;;
        *) die "unknown Debian release $1 (bookworm, trixie)" ;;
    esac
}

# Sets WHEEL_DIR to the wheels of requirements file $1 for CPython $2 on Debian $3,
# downloading them (and building the `# acs: no-wheel` ones) if needed.
WHEEL_DIR=
ensure_wheels() {
    local requirements=$1 python=$2 suite=$3
    local arch key dir tmp py start v name log_file
    arch=$(uname -m)
    key=$({
        echo "cp${python/./}-$arch"
        [ "$suite" = bookworm ] || echo "$suite"
        cat "$requirements"
    } | sha256sum | cut -c1-16)
    dir="$WHEEL_CACHE/$key"
    WHEEL_DIR=$dir
    [ -f "$dir/.complete" ] && return
    # Clones share the cache: one download of a set at a time, and none replaced under a reader.
    if command -v flock >/dev/null 2>&1; then
        exec 8>"$WHEEL_CACHE/.lock"
        flock 8
        [ -f "$dir/.complete" ] && return
    fi
    start=$(now)
    py=$(host_pip)
    tmp=$(mktemp -d "$WHEEL_CACHE/.tmp.XXXXXX")
    TMP_DIRS+=("$tmp")
    log_file="$LOG_DIR/wheels-$key.log"
    : >"$log_file"
    # Pure-Python packages that the index has only as source: built here, once.
    for name in $(sed -n 's/^\([^#[:space:]][^#[:space:]]*\).*#[[:space:]]*acs:[[:space:]]*no-wheel.*/\1/p' "$requirements"); do
        "$py" -m pip wheel --disable-pip-version-check --no-deps "$name" -w "$tmp" >>"$log_file" 2>&1 || {
            tail -n 20 "$log_file" >&2
            die "building a wheel of $name failed (log: $log_file)"
        }
    done
    # Binary wheels for the images' interpreter, whatever the host's Python is.
    local platforms=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch"
        --platform "manylinux1_$arch" --platform "linux_$arch")
    for v in $(seq "$(glibc_of "$suite")" -1 5); do platforms+=(--platform "manylinux_2_${v}_$arch"); done
    if ! "$py" -m pip download --disable-pip-version-check --only-binary=:all: \
        --implementation cp --python-version "$python" --abi "cp${python/./}" --abi abi3 --abi none \
        "${platforms[@]}" --platform any --find-links "$tmp" \
        -r "$requirements" -d "$tmp" >>"$log_file" 2>&1; then
        tail -n 20 "$log_file" >&2
        die "downloading wheels for $requirements failed (log: $log_file)"
    fi
    touch "$tmp/.complete"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    printf '%-12s %-36s %s\n' "wheels" "$requirements" "downloaded in $(since "$start")s"
}

# --- 3. one image per spec --------------------------------------------------

yaml_python() {
    local py
    for py in .venv/bin/python python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import yaml' >/dev/null 2>&1; then
            echo "$py"
            return
        fi
    done
}

# Prints "stem id image context debian python requirements enabled agent_kind" (tab-separated)
# for every spec with a build section; requirements relative to the repository.
list_buildable_specs() {
    local py
    py=$(yaml_python)
    if [ -n "$py" ]; then
        "$py" - <<'PY'
import pathlib, yaml
specs = pathlib.Path("specs")
for path in sorted(specs.glob("*.yaml")) + sorted(specs.glob("*.yml")):
    spec = yaml.safe_load(path.read_text()) or {}
    build = spec.get("build")
    if build:
        req = f"specs/{build['requirements']}" if build.get("requirements") else "-"
        fields = [
            path.stem, spec.get("id", path.stem), spec["image"], build["context"],
            build.get("debian", "bookworm"), str(build.get("python", "3.11")), req,
            "0" if spec.get("enabled", True) is False else "1", spec.get("agent_kind", "acs"),
        ]
        print("\t".join(fields))
PY
        return
    fi
    local f
    for f in specs/*.yaml specs/*.yml; do
        [ -e "$f" ] || continue
        awk -v stem="$(basename "${f%.y*ml}")" '
            function val(line) {
                sub(/^[^:]*:[ \t]*/, "", line)
                sub(/[ \t]+#.*$/, "", line)
                sub(/[ \t]+$/, "", line)
                if (line ~ /^".*"$/ || line ~ /^'\''.*'\''$/) line = substr(line, 2, length(line) - 2)
                return line
            }
            BEGIN { debian = "bookworm"; python = "3.11"; req = "-"; enabled = "1"; kind = "acs" }
            /^[^ \t#]/ { in_build = ($0 ~ /^build:[ \t]*(#.*)?$/) }
            /^id:/ { id = val($0) }
            /^image:/ { image = val($0) }
            /^enabled:/ { enabled = (val($0) == "false" ? "0" : "1") }
            /^agent_kind:/ { kind = val($0) }
            in_build && /^[ \t]+context:/ { context = val($0) }
            in_build && /^[ \t]+debian:/ { debian = val($0) }
            in_build && /^[ \t]+python:/ { python = val($0) }
            in_build && /^[ \t]+requirements:/ { req = "specs/" val($0) }
            END {
                if (context != "") print stem "\t" (id != "" ? id : stem) "\t" image "\t" context \
                    "\t" debian "\t" python "\t" req "\t" enabled "\t" kind
            }
        ' "$f"
    done
}

content_hash() {
    local ctx=$1 base_id=$2
    {
        echo "schema $HASH_SCHEMA"
        echo "base $base_id"
        (cd "$ctx" && find . -type f -printf '%m %p\n' | LC_ALL=C sort)
        (cd "$ctx" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    } | sha256sum | cut -d' ' -f1
}

build_spec() {
    local stem=$1 id=$2 image=$3 context=$4 wheels=$5 base=$6 requirements=$7 kind=$8
    local base_id
    base_id=$(docker image inspect -f '{{.Id}}' "$base")
    local start src ctx hash current
    start=$(now)
    # Same rule as controlplane.specs.catalog.retag: the tag of the last path segment.
    if [ -n "$IMAGE_TAG" ]; then
        local last=${image##*/} prefix=
        [ "$last" = "$image" ] || prefix="${image%/*}/"
        image="$prefix${last%%:*}:$IMAGE_TAG"
    fi
    src="specs/$context"
    [ -f "$src/Dockerfile" ] || die "spec $stem: $src/Dockerfile does not exist"
    [ -n "$image" ] || die "spec $stem: no image"

    ctx=$(mktemp -d "$BUILD_DIR/context.XXXXXX")
    TMP_DIRS+=("$ctx")
    cp -R "$src/." "$ctx/"
    cp -R "$COMMON_DIR" "$ctx/common"
    # Our agent server's code only goes into images that run it.
    if [ "$kind" = acs ]; then
        tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' -cf - agent | tar -C "$ctx" -xf -
    fi
    mkdir "$ctx/wheels"
    cp "$wheels"/*.whl "$ctx/wheels/"
    cp "$requirements" "$ctx/requirements.txt"

    hash=$(content_hash "$ctx" "$base_id")
    current=$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$image" 2>/dev/null || true)
    if [ "$force" -eq 0 ] && [ "$current" = "$hash" ]; then
        printf '%-12s %-36s %s\n' "$id" "$image" "up to date ($(since "$start")s)"
        return
    fi
    local log_file="$LOG_DIR/build-$stem.log"
    if ! docker build \
        --build-arg "BASE_IMAGE=$base" \
        --label "$LABEL=$hash" \
        --label "acs.spec=$id" \
        -t "$image" "$ctx" >"$log_file" 2>&1; then
        tail -n 40 "$log_file" >&2
        die "building $image for spec $stem failed (full log: $log_file)"
    fi
    printf '%-12s %-36s %s\n' "$id" "$image" "built in $(since "$start")s"
}

main() {
    local total_start specs stem id image context debian python requirements enabled kind
    local sel wanted found=0 base built_bases=" "
    total_start=$(now)
    specs=$(list_buildable_specs)
    [ -n "$specs" ] || die "no specs/*.yaml with a build: section"
    while IFS=$'\t' read -r stem id image context debian python requirements enabled kind; do
        if [ ${#selected[@]} -gt 0 ]; then
            wanted=0
            for sel in "${selected[@]}"; do
                if [ "$sel" = "$stem" ] || [ "$sel" = "$id" ]; then wanted=1; fi
            done
        else
            # What the control plane will offer: enabled specs, and those ACS_ENABLE_SPECS names.
            wanted=$enabled
            case "$ENABLE_SPECS" in *",$id,"*) wanted=1 ;; esac
        fi
        [ "$wanted" -eq 1 ] || continue
        found=$((found + 1))
        base=$(base_image_for "$debian")
        case "$built_bases" in
            *" $base "*) ;;
            *)
                ensure_base_image "$debian"
                built_bases="$built_bases$base "
                ;;
        esac
        [ "$requirements" != - ] || requirements=$REQUIREMENTS
        ensure_wheels "$requirements" "$python" "$debian"
        build_spec "$stem" "$id" "$image" "$context" "$WHEEL_DIR" "$base" "$requirements" "$kind"
    done <<<"$specs"
    [ ${#selected[@]} -eq 0 ] || [ "$found" -gt 0 ] ||
        die "no buildable spec named ${selected[*]}"
    # Old versions of our images, now untagged.
    docker image prune -f --filter "label=$LABEL" >/dev/null 2>&1 || true
    printf '%-12s %-36s %s\n' "total" "" "$(since "$total_start")s"
}

main
