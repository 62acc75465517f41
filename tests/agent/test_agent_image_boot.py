"""The sandbox image boots its agent server from bytecode compiled when the image was built:
every module the server imports to answer /health and its first command is read from a .pyc
that matches its source, none compiled at boot. /opt/agent is root's and the server runs as
`agent`, so a missing or stale .pyc would be compiled again at every boot, never saved: CPU a
burst of cold starts pays per sandbox (bench/README.md, `agent_boot.py`)."""

from __future__ import annotations

import re

import docker

from tests.support.sandbox_helpers import DEFAULT_IMAGE

# The server with -v (every import, and where its code object came from), then one client in a
# process of its own: /health, then the first command, as the control plane and a user send them.
BOOT = r"""
set -eu
/opt/agent/bin/python -v -P -m agent --host 127.0.0.1 --port 8000 2>/tmp/verbose &
server=$!
/opt/agent/bin/python -P -c '
import json, os, time, urllib.request
for _ in range(600):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2)
        break
    except OSError:
        time.sleep(0.05)
request = urllib.request.Request(
    "http://127.0.0.1:8000/api/bash/execute_bash_command",
    data=json.dumps({"command": "echo interactive"}).encode(),
    headers={"Content-Type": "application/json", "X-Session-API-Key": os.environ["KEY"]},
)
print(json.load(urllib.request.urlopen(request, timeout=30))["stdout"].strip())
'
kill "$server"
wait "$server" || true
cat /tmp/verbose
"""


def test_the_agent_server_boots_from_the_image_bytecode(
    docker_client: docker.DockerClient, test_prefix: str
) -> None:
    output = docker_client.containers.run(
        DEFAULT_IMAGE,
        ["sh", "-c", BOOT],
        name=f"{test_prefix}bytecode",
        environment={"OH_SESSION_API_KEYS_0": "k", "KEY": "k"},
        entrypoint=[],
        network_mode="none",
        remove=True,
    ).decode()
    assert "interactive" in output.splitlines()
    # importlib's -v lines: "code object from '<path>.pyc'" for bytecode it could use, "code
    # object from <path>.py" (no quotes) for a module compiled from its source.
    from_bytecode = re.findall(r"^# code object from '(\S+\.pyc)'$", output, re.MULTILINE)
    compiled = re.findall(r"^# code object from (/\S+\.py)$", output, re.MULTILINE)
    assert compiled == []
    assert any("/opt/agent/app/agent/__pycache__/bash_routes." in p for p in from_bytecode)
    assert any("/aiohttp/__pycache__/web." in p for p in from_bytecode)
    assert len(from_bytecode) > 200
