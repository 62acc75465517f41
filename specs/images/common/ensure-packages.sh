#!/bin/sh
# Install the given Debian packages (names as arguments, or @FILE for a list
# file with one name per line and '#' comments) unless they are all installed
# already. On our debootstrapped base this is a no-op and needs no network.
set -eu

pkgs=""
for arg in "$@"; do
    case "$arg" in
        @*) pkgs="$pkgs $(sed -e 's/#.*//' "${arg#@}" | tr -s ' \n' '  ')" ;;
        *) pkgs="$pkgs $arg" ;;
    esac
done

missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    echo "ensure-packages: all present:$pkgs"
    exit 0
fi

echo "ensure-packages: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
apt-get clean
rm -rf /var/lib/apt/lists/*
