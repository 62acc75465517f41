"""A real OCI registry for tests: Debian's `docker-registry` (the distribution registry 2.8),
its storage in a temp dir, on a loopback port, with blob and manifest deletion enabled (the
snapshot store's collection needs it). Started and stopped like tests/support/redis_server.py."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RegistryServer:
    """One `docker-registry serve` process; `url` is its base URL (http, loopback)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.storage = directory / "storage"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("docker-registry")
        if binary is None:
            raise RuntimeError("docker-registry is not installed (make test installs it)")
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = _free_port()  # kept across restarts: clients keep their URL
        config = self.directory / "config.yml"
        config.write_text(CONFIG.format(root=self.storage, port=self.port))
        log = (self.directory / "registry.log").open("ab")
        self.process = subprocess.Popen(
            [binary, "serve", str(config)], stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_tail()
            try:
                with urllib.request.urlopen(f"{self.url}/v2/", timeout=1) as answer:  # noqa: S310 (http, loopback)
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        raise RuntimeError(f"docker-registry did not answer: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def blob_paths(self) -> list[Path]:
        """Every blob's data file the registry holds (whatever repository links it)."""
        root = self.storage / "docker" / "registry" / "v2" / "blobs"
        return sorted(root.glob("sha256/*/*/data")) if root.exists() else []

    def linked(self, repositories: str, kind: str = "_layers") -> set[str]:
        """Digests the repositories under `repositories` link (`_layers`: blobs; `_manifests`:
        manifest revisions): what the API serves of them. A blob deleted through the API is
        unlinked at once (its bytes wait for `registry garbage-collect`)."""
        root = self.storage / "docker" / "registry" / "v2" / "repositories" / repositories
        sub = "_layers/sha256" if kind == "_layers" else "_manifests/revisions/sha256"
        return {
            f"sha256:{link.parent.name}" for link in root.glob(f"**/{sub}/*/link") if link.is_file()
        }

    def log_tail(self) -> str:
        path = self.directory / "registry.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""
