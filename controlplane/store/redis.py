"""Connecting to Redis: the configured URL, or an embedded redis-server under the data dir."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controlplane.config import ConfigError
from controlplane.store.retry import single_attempt

log = structlog.get_logger(__name__)

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
"""Exceptions that mean "Redis does not answer" (rendered as 503). StoreBusy (store/pool.py: the
pool stayed full) is one of them for the loops that retry through an outage; what reports an
outage (the errors middleware, /ready) catches it first and says "busy" instead."""


def embedded_redis_url(data_dir: Path) -> str:
    return f"unix://{(data_dir / 'redis' / 'redis.sock').resolve()}"


def ensure_embedded_redis(data_dir: Path, timeout: float = 10.0) -> str:
    """Start a private redis-server with AOF under data_dir unless one already answers.

    It is daemonised on purpose: the CLI and the server share it, and it keeps running when the
    server restarts. It listens on a unix socket only, so it never clashes with another Redis.
    Returns the URL to connect with. Raises ConfigError when redis-server is not installed.
    """
    redis_dir = (data_dir / "redis").resolve()
    sock = redis_dir / "redis.sock"
    url = f"unix://{sock}"
    if sock.exists() and _ping(sock):
        return url
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigError(
            "ACS_REDIS_URL: unset, and redis-server is not installed for the embedded default "
            "(apt-get install redis-server, or set ACS_REDIS_URL)"
        )
    redis_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(  # noqa: S603 - fixed argv, no shell
        [
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--dir",
            str(redis_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--daemonize",
            "yes",
            "--pidfile",
            str(redis_dir / "redis.pid"),
            "--logfile",
            str(redis_dir / "redis.log"),
        ],
        check=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.exists() and _ping(sock):
            log.info("embedded_redis_started", socket=str(sock))
            return url
        time.sleep(0.05)
    raise ConfigError(
        f"ACS_REDIS_URL: embedded redis-server did not start; see {redis_dir}/redis.log"
    )


def _ping(sock: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(1.0)
            conn.connect(str(sock))
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


async def wait_for_redis(client: aioredis.Redis, attempts: int = 10) -> None:
    """Bounded, logged retries at start-up; raises ConfigError naming ACS_REDIS_URL."""
    delay = 0.1
    for attempt in range(1, attempts + 1):
        try:
            with single_attempt():  # the loop below is the retry
                await client.ping()
            return
        except REDIS_DOWN as exc:
            log.warning("redis_not_ready", attempt=attempt, error=str(exc))
            if attempt == attempts:
                raise ConfigError(f"ACS_REDIS_URL: Redis does not answer ({exc})") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
