"""Helpers for sandbox tests: polling with a deadline, spec directories, Docker look-ups; a
plugin of tests/conftest.py for `own_docker`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import docker
import pytest

from drivers.docker.names import LABEL_PREFIX, container_name
from tests.support.types import Client

REPO = Path(__file__).resolve().parents[2]
IMAGE_TAG = os.environ.get("ACS_IMAGE_TAG") or "latest"
DEFAULT_IMAGE = f"acs-sandbox-default:{IMAGE_TAG}"
OPENHANDS_IMAGE = f"acs-sandbox-openhands:{IMAGE_TAG}"


async def wait_status(
    client: Client, headers: dict[str, str], sandbox_id: str, status: str, within: float = 45
) -> dict[str, Any]:
    """Poll GET /api/v1/sandboxes/{id} until `status`; fail loudly with the last body."""
    deadline = time.monotonic() + within
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        resp = await client.get(f"/api/v1/sandboxes/{sandbox_id}", headers=headers)
        body = await resp.json()
        if resp.status == 200 and body["status"] == status:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} not {status} after {within}s: {body}")


async def start(client: Client, headers: dict[str, str], spec: str | None = None) -> dict[str, Any]:
    payload = {"sandbox_spec_id": spec} if spec else {}
    resp = await client.post("/api/v1/sandboxes", json=payload, headers=headers)
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    assert body["status"] == "STARTING"
    return body


async def start_running(
    client: Client, headers: dict[str, str], spec: str | None = None, within: float = 45
) -> dict[str, Any]:
    """A new sandbox (`spec`, else the default), once RUNNING: its body then."""
    started = await start(client, headers, spec)
    return await wait_status(client, headers, started["id"], "RUNNING", within)


async def agent_call(url: str, key: str, command: str) -> dict[str, Any]:
    """A shell command in a sandbox through its agent server's bash API (`url`: its
    AGENT_SERVER endpoint, `key`: the session key)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{url}/api/bash/execute_bash_command",
            json={"command": command, "timeout": 10},
            headers={"X-Session-API-Key": key},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


def spec_dir(tmp: Path, extra: dict[str, str]) -> Path:
    """A spec dir holding the real default spec plus extra YAML files (name -> text)."""
    target = tmp / "specs"
    target.mkdir()
    shutil.copy(REPO / "specs" / "default.yaml", target / "default.yaml")
    for name, text in extra.items():
        (target / f"{name}.yaml").write_text(text)
    return target


def agent_spec(spec_id: str, description: str, more: str = "") -> str:
    """A spec file's YAML: our agent server on the default image, in /workspace, on port 8000
    (AGENT_SERVER); `more` (YAML lines) after."""
    return f"""id: {spec_id}
description: {description}
image: {DEFAULT_IMAGE}
command: ["/opt/agent/bin/python", "-P", "-m", "agent", "--port", "8000"]
working_dir: /workspace
exposed_ports:
  AGENT_SERVER: 8000
{more}"""


HANGING_SPEC = f"""
id: hanging
description: never answers /health
image: {DEFAULT_IMAGE}
command: ["sleep", "1000"]
exposed_ports: {{AGENT_SERVER: 8000}}
resources: {{cpus: 0.5, memory: 64m, pids: 64}}
"""

NO_IMAGE_SPEC = """
id: no-image
description: its image does not exist
image: acs-no-such-image:latest
exposed_ports: {AGENT_SERVER: 8000}
"""


def containers(docker_client: docker.DockerClient, prefix: str) -> list[Any]:
    """The prefix's containers. docker-py inspects each listed container, and one removed in
    between (the code under test deleting it) raises NotFound: list again then."""
    for _ in range(10):
        try:
            return docker_client.containers.list(
                all=True, filters={"label": f"{LABEL_PREFIX}={prefix}"}
            )
        except docker.errors.NotFound:
            time.sleep(0.05)
    raise AssertionError(f"containers of {prefix} kept vanishing while being listed")


def volumes(docker_client: docker.DockerClient, prefix: str) -> list[Any]:
    return docker_client.volumes.list(filters={"name": prefix})


@dataclass(frozen=True)
class OwnDocker:
    """The Docker objects under one test's container prefix, as the engine has them now."""

    client: docker.DockerClient
    prefix: str

    def containers(self) -> list[Any]:
        return containers(self.client, self.prefix)

    def volumes(self) -> list[Any]:
        return volumes(self.client, self.prefix)

    def container(self, sandbox_id: str) -> Any:
        """The sandbox's container (docker.errors.NotFound if it has none)."""
        return self.client.containers.get(container_name(self.prefix, sandbox_id))


@pytest.fixture
def own_docker(docker_client: docker.DockerClient, test_prefix: str) -> OwnDocker:
    """This test's containers, volumes and their engine (tests/support/sandbox_helpers.py)."""
    return OwnDocker(docker_client, test_prefix)


# Runs inside a sandbox: one TCP connect per (host, port), "open" or why not.
_PROBE = r"""
import errno, json, socket, sys
out = []
for host, port in json.loads(sys.argv[1]):
    s = socket.socket()
    s.settimeout(float(sys.argv[2]))
    try:
        s.connect((host, port))
        out.append("open")
    except TimeoutError:
        out.append("timeout")
    except OSError as exc:
        out.append(errno.errorcode.get(exc.errno, str(exc)))
    finally:
        s.close()
print(json.dumps(out))
"""


def exec_as_agent(container: Any, *argv: str) -> tuple[int, str]:
    """`docker exec --user agent`: where an attacker running as the agent stands. Blocking."""
    result = container.exec_run(list(argv), user="agent")
    return int(result.exit_code), result.output.decode(errors="replace").strip()


async def probe_from(
    container: Any, targets: list[tuple[str, int]], timeout: float = 3
) -> dict[tuple[str, int], str]:
    """TCP connects from inside the sandbox, as the agent: target -> "open", "timeout" or the
    errno's name (ECONNREFUSED for a reset, ENETUNREACH for an ICMP "net prohibited"). Off the
    event loop, which may be serving the control plane under test."""
    code, out = await asyncio.to_thread(
        exec_as_agent, container, "python3", "-c", _PROBE, json.dumps(targets), str(timeout)
    )
    assert code == 0, out
    return dict(zip(targets, json.loads(out.splitlines()[-1]), strict=True))


async def lifecycle(client: Client, headers: dict[str, str], **query: str) -> list[dict[str, Any]]:
    """The caller's lifecycle events matching `query` (sandbox_id=…), newest first."""
    params = "&".join(f"{k}={v}" for k, v in query.items())
    resp = await client.get(f"/api/v1/lifecycle-events/search?{params}", headers=headers)
    assert resp.status == 200, await resp.text()
    return list((await resp.json())["items"])


# One call to the LLM gateway, made by python3 in a sandbox: url, token, model, stream (1/0).
GATEWAY_CALL = r"""
import json, sys, urllib.request, urllib.error
url, token, model, stream = sys.argv[1:5]
body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream == "1"}
request = urllib.request.Request(
    url, data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"},
)
try:
    with urllib.request.urlopen(request, timeout=120) as resp:
        print(json.dumps({"status": resp.status, "body": resp.read().decode()}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read().decode()}))
"""


async def call_from(container: Any, url: str, token: str, model: str, stream: bool = False) -> Any:
    """A call to the gateway made inside the sandbox, as the agent user."""
    argv = ("python3", "-c", GATEWAY_CALL, url, token, model, "1" if stream else "0")
    code, out = await asyncio.to_thread(exec_as_agent, container, *argv)
    assert code == 0, out
    return json.loads(out.splitlines()[-1])


def sandbox_of(docker_client: docker.DockerClient, prefix: str, sandbox_id: str) -> Any:
    (container,) = [c for c in containers(docker_client, prefix) if sandbox_id in c.name]
    return container
