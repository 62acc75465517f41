#!/bin/sh
# Create the agent server's venv in /opt/agent from pre-built wheels (no network).
# Usage: install-agent.sh WHEEL_DIR REQUIREMENTS_FILE
# The agent package itself is copied to /opt/agent/app/agent by the Dockerfile;
# a .pth file puts /opt/agent/app on the venv's sys.path.
set -eu
wheels=$1
requirements=$2

python3 -m venv /opt/agent
/opt/agent/bin/python -m pip install --quiet --no-cache-dir --disable-pip-version-check \
    --no-index --find-links "$wheels" -r "$requirements"
# pip and setuptools are not needed at run time: keep the venv small.
/opt/agent/bin/python -m pip uninstall --quiet --yes pip setuptools >/dev/null 2>&1 || true
purelib=$(/opt/agent/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /opt/agent/app > "$purelib/acs-agent.pth"
mkdir -p /opt/agent/app
/opt/agent/bin/python -c 'import aiohttp, pydantic; print("install-agent: aiohttp", aiohttp.__version__, "pydantic", pydantic.VERSION)'
