"""The control plane's own image (Dockerfile), run as docs/deployment.md says: host network, the
host's Docker socket, a real Redis over TCP. Built by the script behind `make image` (docker's
layer cache makes that a second or two when nothing changed)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.control_plane_image import control_plane_image
from tests.support.live_server import free_port
from tests.support.redis_server import redis_on_tcp
from tests.support.sandbox_helpers import IMAGE_TAG

KEY = "image-test-bootstrap-key-0123456789"
SOCKET = "/var/run/docker.sock"


def docker_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image(docker_client: docker.DockerClient) -> str:
    """The image, (re)built from the working tree by the engine `docker_client` reached (once
    per session: tests/drivers/kubernetes/test_deployed_control_plane.py runs it too)."""
    return control_plane_image()


@pytest.fixture
def tcp_redis(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on 127.0.0.1 (the host's loopback, which a --network host
    container shares); returns its URL."""
    with redis_on_tcp(["127.0.0.1"], tmp_path) as port:
        yield f"redis://127.0.0.1:{port}/0"


def call(method: str, url: str, key: str | None = None, timeout: float = 10) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)  # noqa: S310 - http to our own server
    if key is not None:
        request.add_header("X-Session-API-Key", key)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - ditto
            return resp.status, _body(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _body(exc.read())


def _body(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


def wait_for(what: str, probe: Any, within: float) -> Any:
    """Call probe() until it returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (OSError, urllib.error.URLError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {within:g} s; last: {last!r}")


def test_image_metadata(image: str) -> None:
    result = docker_cli("image", "inspect", image)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["controlplane"]
    assert config["Cmd"] == ["serve", "--host", "127.0.0.1", "--port", "3000"]
    assert "3000/tcp" in config["ExposedPorts"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["ACS_SPEC_DIR"] == "/opt/acs/specs"
    assert env["ACS_DATA_DIR"] == "/var/lib/acs"
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "python3"]


def test_without_redis_url_the_cli_says_so(image: str) -> None:
    """The embedded Redis default needs redis-server, which the image does not ship."""
    result = docker_cli("run", "--rm", image, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result.stdout
    assert lines[-1].startswith("controlplane: configuration error: ACS_REDIS_URL: unset"), lines


def test_image_serves_the_api_and_starts_sandboxes(
    image: str, tcp_redis: str, test_prefix: str
) -> None:
    port = free_port()
    name = f"{test_prefix}control-plane"
    group = str(os.stat(SOCKET).st_gid)
    # The documented line (docs/deployment.md), on a free port and a test prefix.
    run = docker_cli(
        *("run", "-d", "--name", name, "--network", "host"),
        *("-v", f"{SOCKET}:{SOCKET}", "--group-add", group),
        *("-e", f"ACS_REDIS_URL={tcp_redis}", "-e", f"ACS_BOOTSTRAP_API_KEY={KEY}"),
        *("-e", f"ACS_CONTAINER_PREFIX={test_prefix}", "-e", "ACS_RATE_LIMIT_PER_MINUTE=0"),
        *("-e", f"ACS_IMAGE_TAG={IMAGE_TAG}"),
        image,
        *("serve", "--host", "127.0.0.1", "--port", str(port)),
    )
    assert run.returncode == 0, run.stderr
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("/health", lambda: call("GET", f"{base}/health") == (200, {"status": "ok"}), 30)
        status, settings = call("GET", f"{base}/api/settings", KEY)
        assert status == 200, settings
        assert call("GET", f"{base}/api/settings")[0] == 401
        assert call("GET", f"{base}/api/settings", KEY + "x")[0] == 401

        # A per-user key made with the CLI inside the container (its last line is the key).
        created = docker_cli("exec", name, "controlplane", "keys", "create", "--user", "alice")
        assert created.returncode == 0, created
        alice = created.stdout.strip().splitlines()[-1]
        status, settings = call("GET", f"{base}/api/settings", alice)
        assert status == 200, settings

        uid = docker_cli("exec", name, "id", "-u")
        assert uid.stdout.strip() == "10001", uid
        # The image's own HEALTHCHECK command, run now rather than after its 30 s interval:
        # it finds --port on PID 1's command line.
        inspect = json.loads(docker_cli("inspect", name).stdout)[0]
        check = docker_cli("exec", name, *inspect["Config"]["Healthcheck"]["Test"][1:])
        assert check.returncode == 0, check

        # A sandbox through the containerised control plane, on the host's engine.
        status, started = call("POST", f"{base}/api/v1/sandboxes", KEY)
        assert status == 200, started
        sandbox_id = started["id"]

        def running() -> dict[str, Any] | None:
            code, body = call("GET", f"{base}/api/v1/sandboxes/{sandbox_id}", KEY)
            assert code == 200, body
            assert body["status"] in ("STARTING", "RUNNING"), body
            return body if body["status"] == "RUNNING" else None

        sandbox = wait_for("sandbox RUNNING", running, 60)
        agent = sandbox["exposed_urls"][0]["url"]
        assert call("GET", f"{agent}/health")[0] == 200
        # Webhooks go to the listener on the sandbox network's gateway (serve's port), which
        # answers nothing but webhooks. As uid 10001 the control plane cannot manage iptables:
        # it says so (docs/deployment.md).
        network = json.loads(docker_cli("network", "inspect", f"{test_prefix}net").stdout)[0]
        gateway = network["IPAM"]["Config"][0]["Gateway"]
        webhook = f"http://{gateway}:{port}/api/v1/webhooks/{sandbox_id}/conversations"
        assert call("POST", webhook)[0] == 401
        assert call("POST", webhook, sandbox["session_api_key"])[0] == 422  # no body
        assert call("GET", f"http://{gateway}:{port}/health")[0] == 404
        assert call("GET", f"http://{gateway}:{port}/api/settings", KEY)[0] == 404
        assert '"host_firewall_unavailable"' in docker_cli("logs", name).stdout
        status, body = call("DELETE", f"{base}/api/v1/sandboxes/{sandbox_id}", KEY)
        assert status == 200, body

        stopped = docker_cli("stop", "-t", "40", name, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        state = json.loads(docker_cli("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, state
        assert '"shutting_down"' in docker_cli("logs", name).stdout
    except BaseException:
        logs = docker_cli("logs", "--tail", "60", name)
        print(f"===== {name} logs =====\n{logs.stdout}{logs.stderr}")
        raise
    finally:
        docker_cli("rm", "-f", name)
