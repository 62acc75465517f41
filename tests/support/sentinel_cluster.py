"""Redis with Sentinel for tests: a master, two replicas and three Sentinels, real redis-server
processes (`redis-server --sentinel` for the Sentinels) on loopback ports of their own, killed
and restarted by the tests."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support import processes
from tests.support.live_server import free_port

MASTER_NAME = "acs-test"
DOWN_AFTER_MS = 1500
"""Sentinel's down-after-milliseconds: a killed master is replaced in about 2.5 s. Much less,
and on a busy host a master just promoted can miss its pings for that long and be replaced in
turn (seen with 1000: a second failover a second after the first)."""


@dataclass
class Node:
    name: str
    port: int
    directory: Path
    args: list[str]
    password: str | None = None
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / f"{self.name}.log"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        self.process = subprocess.Popen(
            [binary, *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def client(self) -> redis.Redis:
        """A client of this node: close it (use it as a context manager)."""
        return redis.Redis(
            port=self.port, password=self.password, socket_timeout=2, socket_connect_timeout=1
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last word to its replicas or Sentinels."""
        if self.process is not None:
            processes.kill(self.process)
            self.process = None

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
            processes.stop(self.process)
            self.process = None


class SentinelCluster:
    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        down_after_ms: int = DOWN_AFTER_MS,
    ) -> None:
        """`password`: the Redis servers' requirepass; `sentinel_password`: the Sentinels'."""
        self.directory = directory
        self.password = password
        self.sentinel_password = sentinel_password
        self.down_after_ms = down_after_ms
        directory.mkdir(parents=True, exist_ok=True)
        self.servers = [self._server(n) for n in range(3)]
        self.sentinels = [self._sentinel(n) for n in range(3)]

    @property
    def sentinel_addresses(self) -> str:
        """ACS_REDIS_SENTINELS."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def _server(self, n: int) -> Node:
        port = free_port()
        args = [
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
            *("--dbfilename", f"redis-{n}.rdb", "--appendonly", "no", "--save", ""),
            *("--logfile", str(self.directory / f"redis-{n}.log")),
            # A replica (re)joining syncs at once, not after the default 5 s of waiting.
            *("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"),
        ]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        return Node(f"redis-{n}", port, self.directory, args, self.password)

    def _sentinel(self, n: int) -> Node:
        port = free_port()
        conf = self.directory / f"sentinel-{n}.conf"
        master = self.servers[0].port
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {self.directory}",
            f"logfile {self.directory / f'sentinel-{n}.log'}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2",
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
            f"sentinel failover-timeout {MASTER_NAME} 10000",
            f"sentinel parallel-syncs {MASTER_NAME} 2",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {MASTER_NAME} {self.password}")
        if self.sentinel_password:
            lines += [
                f"requirepass {self.sentinel_password}",
                f"sentinel sentinel-pass {self.sentinel_password}",
            ]
        conf.write_text("\n".join(lines) + "\n")  # Sentinel rewrites it: a file of its own
        args = [str(conf), "--sentinel"]
        return Node(f"sentinel-{n}", port, self.directory, args, self.sentinel_password)

    def start(self, within: float = 20) -> None:
        first, *replicas = self.servers
        first.start()
        for replica in replicas:
            replica.args += ["--replicaof", "127.0.0.1", str(first.port)]
            replica.start()
        # Replicas online first: a Sentinel learns them from the master's INFO, which it reads
        # every 10 s once it has started.
        deadline = time.monotonic() + within
        while self._online_replicas(first) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"replicas not online in {within} s:\n{self.logs()}")
            time.sleep(0.05)
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_stable(within)

    @staticmethod
    def _online_replicas(master: Node) -> int:
        try:
            with master.client() as client:
                info = client.info("replication")
        except redis.RedisError:
            return 0
        return sum(1 for k, v in info.items() if k.startswith("slave") and "online" in str(v))

    def master_port(self) -> int:
        """The master's port as the first answering Sentinel names it."""
        for sentinel in self.sentinels:
            if not sentinel.alive():
                continue
            with contextlib.suppress(redis.RedisError):
                with sentinel.client() as client:
                    _host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(port)
        raise RuntimeError("no Sentinel answers")

    def master(self) -> Node:
        port = self.master_port()
        return next(s for s in self.servers if s.port == port)

    def wait_stable(self, within: float) -> None:
        """Every Sentinel sees the same master, its two replicas online and the other two
        Sentinels: a failover can happen from here."""
        deadline = time.monotonic() + within
        problem: str | None = "not checked"
        while time.monotonic() < deadline:
            problem = self._instability()
            if problem is None:
                return
            time.sleep(0.1)
        raise RuntimeError(f"Sentinel set-up not stable in {within} s: {problem}")

    def _instability(self) -> str | None:
        masters = set()
        for sentinel in self.sentinels:
            try:
                with sentinel.client() as client:
                    state = client.sentinel_master(MASTER_NAME)
            except redis.RedisError as exc:
                return f"{sentinel.name}: {exc}"
            seen = (state.get("num-slaves"), state.get("num-other-sentinels"))
            if seen != (2, 2):
                return f"{sentinel.name}: (replicas, other sentinels) = {seen}"
            if state.get("is_sdown") or state.get("is_odown"):
                return f"{sentinel.name}: master down"
            masters.add(int(state["port"]))
        if len(masters) != 1:
            return f"the Sentinels disagree: {masters}"
        online = self._online_replicas(self.master())
        return None if online == 2 else f"{online} replicas online"

    def kill_master(self) -> Node:
        """SIGKILL the current master; returns it (start() brings it back as a replica)."""
        node = self.master()
        node.kill()
        return node

    def wait_failover(self, old_port: int, within: float = 20) -> float:
        """Seconds until a Sentinel names a master other than `old_port`."""
        started = time.monotonic()
        while time.monotonic() - started < within:
            with contextlib.suppress(RuntimeError):
                if self.master_port() != old_port:
                    return time.monotonic() - started
            time.sleep(0.05)
        raise RuntimeError(f"no failover from port {old_port} in {within} s")

    def logs(self) -> str:
        out = []
        for node in [*self.servers, *self.sentinels]:
            if node.log.exists():
                out.append(
                    f"--- {node.name}\n" + "\n".join(node.log.read_text().splitlines()[-30:])
                )
        return "\n".join(out)

    def stop(self) -> None:
        for node in [*self.sentinels, *self.servers]:
            node.stop()
