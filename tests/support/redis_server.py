"""A real redis-server for tests, on a unix socket in a temp dir (no port races)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis


class RedisServer:
    def __init__(self, directory: Path, *, fsync_always: bool = False) -> None:
        """`fsync_always`: every write is on disk before Redis answers it, so a SIGKILL loses
        nothing acknowledged (the default fsyncs every second)."""
        self.directory = directory
        self.fsync_always = fsync_always
        self.socket = directory / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--appendfsync",
                "always" if self.fsync_always else "everysec",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(unix_socket_path=str(self.socket)).ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start in {self.directory}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def wait_answering(
    process: subprocess.Popen[bytes], client: redis.Redis, within: float = 10
) -> None:
    """Until a redis-server started as `process` answers `client`'s PING (it failing if the
    process exits, or after `within` seconds)."""
    deadline = time.monotonic() + within
    while True:
        try:
            client.ping()
            return
        except redis.exceptions.ConnectionError:
            assert process.poll() is None, f"redis-server exited ({process.returncode})"
            assert time.monotonic() < deadline, f"redis-server did not answer in {within:g} s"
            time.sleep(0.05)
