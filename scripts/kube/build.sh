#!/usr/bin/env bash
# Builds the Kubernetes binaries of the test cluster (docs/test-cluster.md) from Debian's
# `kubernetes` source package (upstream v1.20.2 with its vendor/ tree), offline, with Debian's Go,
# and caches them as one .tgz outside the clone so that a fresh clone on the same machine finds
# them again. Prints the directory holding the unpacked binaries on stdout.
#
# Usage: scripts/kube/build.sh [--print-key | --check-source]
#   --print-key     the cache key (below), nothing else
#   --check-source  find the source package, unpack it and check that our patches apply, then
#                   stop (a minute, no build): what a new Debian upload would break shows here
#
# Environment:
#   ACS_KUBE_CACHE     the cache (default ~/.cache/acs/kubernetes): kubernetes-<key>.tgz, its
#                      unpacked bin-<key>/, the downloaded source package (source/), build logs.
#                      Never the Go build cache: it lives in the temporary build dir and goes.
#   ACS_DEBIAN_MIRROR  Debian mirror for the deb-src list (default http://deb.debian.org/debian).
#   ACS_DEBIAN_SECURITY_MIRROR  the security archive (default http://deb.debian.org/debian-security).
#   TMPDIR             where the temporary build tree goes (about 3 GB; default /var/tmp).
#
# The cache key hashes the pinned version, the recipe (this script from "# 2. Unpack" on, its
# comments aside: how the source is found and what is said about it do not change the binaries),
# the patches under scripts/kube/patches/ and the Go version: change any of them and the next run
# builds again. What is built, and why it is lean:
#   - the source package's version is pinned (SOURCE_VERSION); apt checks its files against the
#     signed Sources index of a private apt configuration (the host's apt config is not touched).
#     A Debian mirror serves one version per suite: once a point release or a security update
#     replaces the pinned one (snapshot.debian.org may be out of reach), the newest version the
#     mirror serves of the same upstream release is used instead, with a warning, and our
#     patches must still apply; otherwise the build stops and says what to change;
#   - only pkg/generated/openapi is generated (`make gen_openapi`): the tarball has every other
#     generated file;
#   - the vendored modern-go/reflect2 v1.0.1 (broken on Go >= 1.18) is replaced by Debian's 1.0.2;
#   - GOPATH mode (Kubernetes 1.20 builds with GO111MODULE=off), CGO off, one `go build` for all
#     six commands so the shared packages compile once, `-tags providerless` (no in-tree cloud
#     providers and their SDKs), `-trimpath -ldflags "-s -w"`;
#   - the pause binary of the pod sandbox image from build/pause/linux/pause.c (static, gcc).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PATCH_DIR=$ROOT/scripts/kube/patches
CACHE=${ACS_KUBE_CACHE:-${ACS_CACHE_DIR:-$HOME/.cache/acs}/kubernetes}
MIRROR=${ACS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${ACS_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SOURCE_PACKAGE=kubernetes
SOURCE_VERSION=1.20.5+really1.20.2-1.1+deb12u1
KUBE_VERSION=v1.20.2
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

log() { echo "kube-build: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

cache_key() {
    command -v go >/dev/null || die "Go is missing: run scripts/bootstrap-host.sh --kube (as root)"
    grep -q '^# 2\. Unpack' "$0" || die "the recipe's first line (# 2. Unpack) is gone: the key needs it"
    {
        echo "$SOURCE_PACKAGE $SOURCE_VERSION"
        go version
        # The recipe: comment edits do not rebuild.
        sed -n '/^# 2\. Unpack/,$p' "$0" | grep -v '^[[:space:]]*#'
        for patch in "$PATCH_DIR"/*.patch; do
            echo "== $(basename "$patch")"
            cat "$patch"
        done
    } | sha256sum | cut -c1-16
}

key=$(cache_key)
mode=build
case "${1:-}" in
    --print-key)
        echo "$key"
        exit 0
        ;;
    --check-source) mode=check ;;
    "") ;;
    *) die "unknown option $1 (usage: $0 [--print-key | --check-source])" ;;
esac
archive=$CACHE/kubernetes-$KUBE_VERSION-$key.tgz
bin_dir=$CACHE/bin-$key

# Unpack the cached archive once; bin-<key>/.complete marks a finished unpack.
unpack() {
    [ -f "$bin_dir/.complete" ] && return 0
    local tmp
    tmp=$(mktemp -d "$CACHE/.unpack.XXXXXX")
    tar -xzf "$archive" -C "$tmp"
    touch "$tmp/.complete"
    rm -rf "$bin_dir"
    mv "$tmp" "$bin_dir"
}

mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9 # one build at a time; a second caller waits and then finds the archive
if [ -f "$archive" ] && [ "$mode" = build ]; then
    unpack
    echo "$bin_dir"
    exit 0
fi

for tool in go gcc rsync make patch dpkg-source xz apt-get; do
    command -v "$tool" >/dev/null || die "$tool is missing: run scripts/bootstrap-host.sh --kube (as root)"
done
[ -d "$REFLECT2" ] || die "$REFLECT2 is missing: apt-get install golang-github-modern-go-reflect2-dev"

started=$(now)
work=$(mktemp -d "${TMPDIR:-/var/tmp}/acs-kube-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log_file=$CACHE/logs/$mode-$key.log
mkdir -p "$CACHE/logs"
: >"$log_file"
if [ "$mode" = build ]; then
    log "cold build of Kubernetes $KUBE_VERSION (key $key); log: $log_file"
fi

# 1. The source package, through a private apt configuration with a deb-src list: the pinned
#    version, from the cache or the mirror; else the newest the mirror serves of the same upstream
#    release (its Debian revision differs: the patches below say whether it still fits).
source_dir=$CACHE/source
version=$SOURCE_VERSION
dsc_of() { echo "$source_dir/${SOURCE_PACKAGE}_${1#*:}.dsc"; }
if [ ! -f "$(dsc_of "$version")" ]; then
    step=$(now)
    apt_dir=$work/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/parts" "$source_dir"
    {
        echo "deb-src $MIRROR bookworm main"
        echo "deb-src $SECURITY_MIRROR bookworm-security main"
    } >"$apt_dir/sources.list"
    apt_opts=(
        -o "Dir::Etc::SourceList=$apt_dir/sources.list"
        -o "Dir::Etc::SourceParts=$apt_dir/parts"
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache::Archives=$apt_dir/archives"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
        -o "APT::Sandbox::User=root"
    )
    apt-get "${apt_opts[@]}" -q update >>"$log_file" 2>&1 || die "apt-get update (deb-src) failed: $log_file"
    served=$(apt-cache "${apt_opts[@]}" showsrc "$SOURCE_PACKAGE" 2>>"$log_file" |
        awk '/^Version:/ { print $2 }' | sort -u)
    if ! grep -qxF "$SOURCE_VERSION" <<<"$served"; then
        upstream=${SOURCE_VERSION%-*} # the upstream part: what the patches were written for
        newest=""
        for candidate in $served; do
            [ "${candidate%-*}" = "$upstream" ] || continue
            if [ -z "$newest" ] || dpkg --compare-versions "$candidate" gt "$newest"; then
                newest=$candidate
            fi
        done
        [ -n "$newest" ] || die "the Debian mirror ($MIRROR) no longer serves $SOURCE_PACKAGE \
$SOURCE_VERSION nor any other Debian revision of $upstream (it serves: ${served:-nothing}). \
To go on: put the .dsc and the files it names of $SOURCE_VERSION into $source_dir (another \
machine's cache has them), or point ACS_DEBIAN_MIRROR at a mirror that keeps it, or move \
SOURCE_VERSION and KUBE_VERSION in scripts/kube/build.sh to a version it serves and bring \
scripts/kube/patches/ up to date (\`scripts/kube/build.sh --check-source\` says which no longer apply)."
        log "WARNING: the mirror no longer serves $SOURCE_PACKAGE $SOURCE_VERSION; building from" \
            "$newest (same upstream $upstream). Pin it: SOURCE_VERSION=$newest in scripts/kube/build.sh"
        version=$newest
    fi
    (cd "$source_dir" && apt-get "${apt_opts[@]}" -q source --download-only \
        "$SOURCE_PACKAGE=$version") >>"$log_file" 2>&1 ||
        die "apt-get source $SOURCE_PACKAGE=$version failed: $log_file"
    log "source package $version downloaded in $(since "$step") s"
fi
dsc=$(dsc_of "$version")

# 2. Unpack (Debian's own patches applied), then ours, then reflect2 1.0.2.
step=$(now)
src=$work/gopath/src/k8s.io/kubernetes
mkdir -p "$(dirname "$src")"
dpkg-source -x "$dsc" "$src" >>"$log_file" 2>&1 || die "dpkg-source -x failed: $log_file"
for patch in "$PATCH_DIR"/*.patch; do
    patch -d "$src" -p1 --quiet --forward <"$patch" >>"$log_file" 2>&1 ||
        die "patch $(basename "$patch") does not apply to $SOURCE_PACKAGE $version (log: \
$log_file): update it in scripts/kube/patches/ for that version, or pin one it applies to \
(SOURCE_VERSION in scripts/kube/build.sh)"
done
rm -rf "$src/vendor/github.com/modern-go/reflect2"
cp -r "$REFLECT2" "$src/vendor/github.com/modern-go/reflect2"
log "unpacked and patched in $(since "$step") s"
if [ "$mode" = check ]; then
    log "$SOURCE_PACKAGE $version: found, unpacked, every patch applies"
    exit 0
fi

export GOPATH=$work/gopath GOCACHE=$work/gocache GO111MODULE=off CGO_ENABLED=0 GOFLAGS=
export HOME=$work/home GOPROXY=off GOTOOLCHAIN=local
mkdir -p "$HOME"

# 3. The one missing generated file set: pkg/generated/openapi.
step=$(now)
make -C "$src" gen_openapi >>"$log_file" 2>&1 || die "make gen_openapi failed: $log_file"
log "openapi generated in $(since "$step") s"

# 4. The six commands in one go build.
step=$(now)
out=$work/out
mkdir -p "$out/bin"
version_flags=""
for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
    k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
    version_flags+=" -X $pkg.gitTreeState=archive -X $pkg.gitCommit=debian-$version"
done
packages=()
for command in "${COMMANDS[@]}"; do packages+=("k8s.io/kubernetes/cmd/$command"); done
(cd "$src" && go build -p "$(nproc)" -trimpath -tags providerless,notest \
    -ldflags "-s -w$version_flags" -o "$out/bin/" "${packages[@]}") >>"$log_file" 2>&1 ||
    die "go build failed: $log_file"
log "commands built in $(since "$step") s"

# 5. The pause binary (the pod sandbox image's only file).
gcc -Os -Wall -Werror -static -DVERSION="$KUBE_VERSION-acs" \
    -o "$out/bin/pause" "$src/build/pause/linux/pause.c" >>"$log_file" 2>&1 ||
    die "pause.c failed to build: $log_file"

for command in "${COMMANDS[@]}"; do
    case $command in kubectl) check=(version --client) ;; *) check=(--version) ;; esac
    "$out/bin/$command" "${check[@]}" >>"$log_file" 2>&1 || die "$command ${check[*]} failed: $log_file"
done
echo "$KUBE_VERSION $SOURCE_PACKAGE=$version key=$key" >"$out/bin/VERSION"

step=$(now)
tar -cf - -C "$out/bin" . | gzip -1 >"$work/archive.tgz" # -1: a third of -6's time, 10% larger
mv "$work/archive.tgz" "$archive"
unpack
log "cached as $archive ($(du -h "$archive" | cut -f1)) in $(since "$step") s; total $(since "$started") s"

# Keep this build and the newest other one (another checkout's recipe, so that two branches do
# not rebuild in turn); older ones go.
for old in $(ls -t "$CACHE"/kubernetes-*.tgz | grep -v -- "-$key.tgz" | tail -n +2); do
    old_key=${old##*-}
    old_key=${old_key%.tgz}
    rm -rf "$old" "$CACHE/bin-$old_key" "$CACHE/logs/build-$old_key.log"
done
echo "$bin_dir"
