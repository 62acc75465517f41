"""A dockerd of a test's own (tests/test_engine_restart.py, tests/snapshots/test_portability.py):
its own socket, data root, exec root and pid file (its own containerd under that exec root), a
default bridge of its own and no iptables, so it cannot touch the host's networking or the
shared engine's containers. Images reach it by `docker save | docker load` (no registry of
images here). A control plane on it runs with ACS_HOST_FIREWALL=off and SUBNET_POOL
(docs/deployment.md#a-second-engine)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

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

    def load(self, *images: str) -> None:
        """`docker save | docker -H <ours> load`: no registry of images on this machine."""
        save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
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
