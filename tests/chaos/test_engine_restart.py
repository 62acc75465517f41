"""The Docker engine killed with SIGKILL and started again (no live-restore): a running sandbox's
container comes back exited; the control plane shows it PAUSED, resumable, with the reason,
within one reconcile interval of the engine answering, and resume finds the workspace intact.

Never the shared engine: the test starts a second dockerd of its own, on its own socket, data
root, exec root and pid file (its own containerd under that exec root), with a default bridge
of its own and no iptables, so it cannot touch the host's networking or the other engine's
containers, and
loads the sandbox image into it with `docker save | docker load`. The control plane runs with
ACS_HOST_FIREWALL=off and a subnet pool of its own (docs/deployment.md#a-second-engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from controlplane import keys
from drivers.docker import names as docker_names
from tests.support.sandbox_helpers import start, wait_status
from tests.support.types import Client

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.usefixtures("sandbox_images")]

RECONCILE_INTERVAL = 3.0
SUBNET_POOL = "10.231.0.0/16"  # not the default pool: nothing else on the host routes it
# The second engine's default bridge: an interface of the test's own. `--bridge=none` is not an
# option: a dockerd started with it deletes the host's `docker0` (moby's
# removeDefaultBridgeInterface), which the shared engine's default network still needs.
BRIDGE_ADDRESS = "10.232.255.1/24"


class SecondEngine:
    """A dockerd of the test's own under a short /tmp directory (unix socket paths are short)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="acs-eng-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.url = f"unix://{self.socket}"
        (self.root / "daemon.json").write_text("{}")  # never /etc/docker/daemon.json
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self.bridge = "acseng" + secrets.token_hex(4)  # at most 15 characters
        for step in (
            ["link", "add", self.bridge, "type", "bridge"],
            ["addr", "add", BRIDGE_ADDRESS, "dev", self.bridge],
            ["link", "set", self.bridge, "up"],
        ):
            subprocess.run(["ip", *step], check=True, capture_output=True)

    def start(self) -> float:
        """Start dockerd; the monotonic time it first answered."""
        if self._log is None:
            self._log = (self.root / "dockerd.log").open("ab")
        log = self._log
        self.process = subprocess.Popen(
            [
                "dockerd",
                "--config-file", str(self.root / "daemon.json"),
                "-H", self.url,
                "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"),
                "--pidfile", str(self.root / "docker.pid"),
                f"--bridge={self.bridge}",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.cli("version", check=False).returncode == 0:
                return time.monotonic()
            assert self.process.poll() is None, self.log_tail()
            time.sleep(0.2)
        raise AssertionError(f"the second engine did not answer: {self.log_tail()}")

    def kill9(self) -> None:
        """SIGKILL dockerd. Its containerd dies with it (parent-death signal) and the shims
        live on; wait for containerd to be gone, or a new dockerd would wait for the old one."""
        assert self.process is not None
        containerd = self._containerd_pid()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 15
        while containerd and Path(f"/proc/{containerd}").exists():
            assert time.monotonic() < deadline, "the engine's containerd outlived it"
            time.sleep(0.1)

    def _containerd_pid(self) -> int | None:
        try:
            return int((self.root / "exec" / "containerd" / "containerd.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def shims(self) -> list[int]:
        """containerd shims of this engine (they outlive it): found by their -address."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                cmdline
                and cmdline[0].endswith(b"containerd-shim-runc-v2")
                and any(arg.startswith(str(self.root).encode()) for arg in cmdline)
            ):
                found.append(int(proc.name))
        return found

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Whatever of this engine is left (a failed test may leave a shim and its container's
        # processes): only processes of our own root, by pid, never by name.
        for shim in self.shims():
            children = Path(f"/proc/{shim}/task/{shim}/children")
            with contextlib.suppress(OSError):
                for child in children.read_text().split():
                    os.kill(int(child), signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(shim, signal.SIGKILL)
        containerd = self._containerd_pid()
        if containerd and Path(f"/proc/{containerd}").exists():
            with contextlib.suppress(OSError):
                os.kill(containerd, signal.SIGTERM)
        time.sleep(1)
        if self._log is not None:
            self._log.close()
        # Mounts left under the data and exec roots (overlays, network namespaces).
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(self.root))
        ]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        subprocess.run(["ip", "link", "delete", self.bridge], check=False, capture_output=True)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["docker", "-H", self.url, *args], check=check, capture_output=True, timeout=120
        )

    def load(self, image: str) -> None:
        """`docker save | docker -H <ours> load`: no registry on this machine."""
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        loaded = subprocess.run(
            ["docker", "-H", self.url, "load"],
            stdin=save.stdout,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert save.stdout is not None
        save.stdout.close()
        assert save.wait() == 0
        assert loaded.returncode == 0, loaded.stderr

    def log_tail(self) -> str:
        return (self.root / "dockerd.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def engine() -> Iterator[SecondEngine]:
    second = SecondEngine()
    try:
        second.start()
        yield second
    finally:
        second.stop()


@pytest.fixture
async def second_engine_client(
    engine: SecondEngine,
    make_client: Callable[..., Awaitable[Client]],
    test_prefix: str,
) -> Client:
    return await make_client(
        with_sandboxes=True,
        docker_url=engine.url,
        container_prefix=test_prefix,
        sandbox_subnet_pool=SUBNET_POOL,
        host_firewall="off",
        reconcile_interval=RECONCILE_INTERVAL,
    )


def inspect_state(engine: SecondEngine, name: str) -> dict[str, Any]:
    out = engine.cli("inspect", "--format", "{{json .State}}", name).stdout
    state: dict[str, Any] = json.loads(out)
    return state


# The docker SDK's connection pool drops the keep-alive sockets the killed engine broke without
# closing them (urllib3); they are collected whenever the GC runs, here or later.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_engine_killed_and_restarted_leaves_sandboxes_resumable(
    engine: SecondEngine,
    second_engine_client: Client,
    test_prefix: str,
    user_headers: Callable[..., Awaitable[dict[str, str]]],
) -> None:
    engine.load(second_engine_client.app[keys.SPECS].default.image)
    alice = await user_headers("alice")
    sandbox = await start(second_engine_client, alice)
    sandbox_id = sandbox["id"]
    await wait_status(second_engine_client, alice, sandbox_id, "RUNNING", within=90)
    name = docker_names.container_name(test_prefix, sandbox_id)
    engine.cli("exec", name, "sh", "-c", "echo survived > /workspace/marker")

    engine.kill9()
    resp = await second_engine_client.get("/ready")
    assert resp.status == 503
    ready = await resp.json()
    assert ready["runtime"] is False
    assert ready["driver"] == "docker"
    answered = await asyncio.to_thread(engine.start)

    # Without live-restore the engine stops what was running when it comes back: SIGTERM to the
    # container's init (our agent image exits 0 on it; an init that ignores it is killed: 137).
    state = inspect_state(engine, name)
    assert state["Status"] == "exited", state
    code = str(state["ExitCode"])
    body = await wait_status(
        second_engine_client, alice, sandbox_id, "PAUSED", within=RECONCILE_INTERVAL + 30
    )
    took = time.monotonic() - answered
    assert took <= RECONCILE_INTERVAL + 2, f"PAUSED {took:.1f} s after the engine answered"
    assert f"exit code {code}" in body["reason"], body
    assert "resume" in body["reason"]
    print(f"engine answered; PAUSED {took:.1f} s later; exit code {code}")

    events = await second_engine_client.get(
        "/api/v1/lifecycle-events/search", params={"sandbox_id": sandbox_id}, headers=alice
    )
    latest = (await events.json())["items"][0]
    assert latest["type"] == "sandbox.paused"
    assert latest["automatic"] is True
    assert f"exit code {code}" in latest["reason"]

    resp = await second_engine_client.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200, await resp.text()
    await wait_status(second_engine_client, alice, sandbox_id, "RUNNING", within=90)
    marker = engine.cli("exec", name, "cat", "/workspace/marker").stdout.decode().strip()
    assert marker == "survived"

    resp = await second_engine_client.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 200
    remaining = docker.DockerClient(base_url=engine.url)
    try:
        assert not remaining.containers.list(all=True, filters={"name": name})
    finally:
        remaining.close()
    # Collect those sockets now, within this test's filters, not at the end of the session.
    await second_engine_client.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
