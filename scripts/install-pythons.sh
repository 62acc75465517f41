#!/usr/bin/env bash
# The Python versions of the OpenHands client venvs (tests/support/openhands_clients.py:
# PYTHON_VERSION for the CLI and SDK clients, OFFICIAL_PYTHON for the SDK at the official agent
# server's version), looked for where the tests look: pyenv's (`pyenv prefix`, then
# $PYENV_ROOT/versions, ~/.pyenv/versions), then pythonX.Y on PATH. Says where each one comes
# from; installs a missing one where this host can: with pyenv (`pyenv install`: python.org and
# a compiler), else Debian's package when the release has that version (bookworm has 3.11 only,
# trixie 3.13); otherwise says what to do and fails. `scripts/bootstrap-host.sh --clients` runs
# it, and so does `make test-prep`.
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=tests/support/openhands_clients.py
versions=()
for name in PYTHON_VERSION OFFICIAL_PYTHON; do
    found=$(sed -n "s/^$name = \"\\([0-9.]*\\)\"$/\\1/p" "$CLIENTS")
    [ -n "$found" ] || {
        echo "pythons: $name is no longer in $CLIENTS: update this script" >&2
        exit 1
    }
    versions+=("$found")
done

have() { command -v "$1" >/dev/null 2>&1; }
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
pyenv_bin=$(command -v pyenv || { [ -x "$pyenv_root/bin/pyenv" ] && echo "$pyenv_root/bin/pyenv"; } || true)

# The interpreter of version $1, as the tests find it; nothing when there is none.
find_python() {
    local version=$1 prefix candidate
    if [ -n "$pyenv_bin" ]; then
        prefix=$(PYENV_ROOT=$pyenv_root "$pyenv_bin" prefix "$version" 2>/dev/null | cut -d: -f1 || true)
        if [ -n "$prefix" ] && [ -x "$prefix/bin/python" ]; then
            echo "$prefix/bin/python"
            return
        fi
    fi
    for candidate in $(ls -d "$pyenv_root"/versions/"$version".*/bin/python 2>/dev/null | sort -V -r); do
        echo "$candidate"
        return
    done
    command -v "python$version" || true
}

# Where an interpreter comes from, in words.
origin() {
    case $1 in
        "$pyenv_root"/*) echo "pyenv ($pyenv_root)" ;;
        /usr/bin/*) echo "the system ($(dpkg -S "$(readlink -f "$1")" 2>/dev/null | cut -d: -f1 || echo "not a Debian package"))" ;;
        *) echo "PATH" ;;
    esac
}

install_python() {
    local version=$1 log
    if [ -n "$pyenv_bin" ]; then
        log=$(mktemp)
        echo "pythons: installing Python $version with pyenv (python.org, then a build of a few minutes)"
        if PYENV_ROOT=$pyenv_root "$pyenv_bin" install --skip-existing "$version" >"$log" 2>&1; then
            rm -f "$log"
            return 0
        fi
        echo "pythons: pyenv install $version failed (python.org unreachable, or a build dependency missing):" >&2
        tail -n 5 "$log" | sed 's/^/    /' >&2
        rm -f "$log"
    fi
    if [ "$(id -u)" = 0 ] && have apt-get && apt-cache show "python$version" >/dev/null 2>&1; then
        echo "pythons: installing Debian's python$version"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$version" "python$version-venv" >/dev/null &&
            return 0
    fi
    return 1
}

missing=()
for version in "${versions[@]}"; do
    python=$(find_python "$version")
    if [ -z "$python" ] && install_python "$version"; then
        python=$(find_python "$version")
    fi
    if [ -z "$python" ]; then
        missing+=("$version")
        continue
    fi
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        echo "pythons: $python has no venv module (Debian: apt-get install python$version-venv)" >&2
        missing+=("$version")
        continue
    fi
    echo "pythons: Python $version: $python, from $(origin "$python")"
done

if [ ${#missing[@]} -gt 0 ]; then
    cat >&2 <<EOF
pythons: no usable Python ${missing[*]}: the OpenHands client tests (tests/clients/) need it.
  Install it where the tests look, e.g. with pyenv
  (https://github.com/pyenv/pyenv#installation; then \`pyenv install ${missing[0]}\`), or as
  python${missing[0]} on PATH (a distribution's package with its venv module), and run this again.
EOF
    exit 1
fi
