"""A real redis-server for tests, on a unix socket in a temp dir (no port races)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import redis

from tests.support import processes
from tests.support.live_server import free_port


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
            processes.kill(self.process)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process)
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


@contextlib.contextmanager
def redis_on_tcp(
    addresses: Sequence[str],
    directory: Path,
    *,
    password: str | None = None,
    protected: bool = True,
) -> Iterator[int]:
    """A redis-server on TCP, bound to `addresses` on a free port of the first, with no
    persistence, until the block ends: its port. `protected=False` turns protected mode off (a
    careless host service)."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed (make test installs it)"
    port = free_port(addresses[0])
    argv = [binary, "--port", str(port), "--bind", *addresses, "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(directory)]
    if password is not None:
        argv += ["--requirepass", password]
    if not protected:
        argv += ["--protected-mode", "no"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host=addresses[0], port=port, password=password)
    try:
        wait_answering(process, client)
        yield port
    finally:
        client.close()
        processes.stop(process)
