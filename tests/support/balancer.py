"""A real load balancer for tests: Debian's haproxy on loopback, in front of `controlplane
serve` replicas, checking their /ready as a production balancer would (docs/deployment.md has
the same configuration)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support import processes
from tests.support.live_server import free_port

CONFIG = """\
global
    maxconn 2048
    stats socket {admin} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout tunnel 1h
    timeout http-keep-alive 10s
    # /ready asks Redis and the Docker engine: on a busy host an answer can take a while,
    # and a check that times out would take a healthy replica out.
    timeout check 3s
    retries 3
    option redispatch 1
    # A request whose replica died before answering is sent to another one, unless it is a
    # POST (a replay could start a second conversation): POSTs are retried only when their
    # connection failed, which is before any byte reached a replica.
    retry-on conn-failure empty-response response-timeout

frontend api
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    # A fresh connection to a replica per request: a request for a replica that died is then
    # refused before any byte reaches it, which is safe to send elsewhere, POSTs included (an
    # idle kept-alive connection to the dead replica would swallow the request instead).
    option http-server-close
    http-request disable-l7-retry if METH_POST
    option httpchk GET /ready
    http-check expect status 200
    default-server inter {inter_ms}ms fastinter {inter_ms}ms downinter {inter_ms}ms fall 2 rise 2
{servers}
"""


class Balancer:
    """haproxy with one server line per replica port; `url` is the one address."""

    def __init__(self, directory: Path, replica_ports: list[int], *, inter_ms: int = 300) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = directory / "haproxy.sock"
        self.replica_ports = replica_ports
        self.inter_ms = inter_ms
        self.process: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        servers = "\n".join(
            f"    server r{n} 127.0.0.1:{port} check" for n, port in enumerate(self.replica_ports)
        )
        return CONFIG.format(
            admin=self.admin, port=self.port, inter_ms=self.inter_ms, servers=servers
        )

    def start(self, within: float = 10) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            raise RuntimeError("haproxy is not installed (scripts/bootstrap-host.sh installs it)")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "haproxy.cfg"
        path.write_text(self.config())
        check = subprocess.run(
            [binary, "-c", "-f", str(path)], check=False, capture_output=True, text=True
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refuses its configuration:\n{check.stdout}{check.stderr}")
        with (self.directory / "haproxy.log").open("wb") as log:  # the child keeps its own fd
            self.process = subprocess.Popen(
                [binary, "-db", "-f", str(path)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not listen:\n{self.log()}")
            time.sleep(0.05)

    def states(self) -> dict[str, str]:
        """Each replica's state as haproxy sees it: UP, DOWN, MAINT…"""
        out = self._admin("show stat\n")
        states = {}
        for line in out.splitlines():
            fields = line.split(",")
            if len(fields) > 17 and fields[0] == "replicas" and fields[1].startswith("r"):
                states[fields[1]] = fields[17]
        return states

    def wait_state(self, server: str, state: str, within: float = 15) -> float:
        """Seconds until haproxy sees `server` in `state` (UP or DOWN)."""
        started = time.monotonic()
        while True:
            seen = self.states().get(server, "")
            if seen.startswith(state):
                return time.monotonic() - started
            if time.monotonic() - started > within:
                raise AssertionError(f"{server} not {state} in {within} s: {self.states()}")
            time.sleep(0.05)

    def _admin(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(5)
            conn.connect(str(self.admin))
            conn.sendall(command.encode())
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def log(self) -> str:
        path = self.directory / "haproxy.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process)
            self.process = None
