"""Redis that survives a failover: the client for a plain URL, for the master that Redis
Sentinel names (found again at every reconnect), or for the embedded redis-server.

Every command, pipeline, script call, connect and subscription of a client made here is retried
through an outage for a bounded time (controlplane/store/retry.py): a request waits through a
Sentinel failover (a couple of seconds) instead of failing, and one that cannot wait longer
still fails in bounded time. What a request writes is acknowledged by replicas before it is
answered (controlplane/store/durable.py). Lua scripts need nothing more: redis-py's script
objects load a script again when a new master answers NOSCRIPT.

Each client's connections come from one bounded pool (controlplane/store/pool.py): a burst waits
for a free connection, up to ACS_REDIS_POOL_TIMEOUT, and one that waited too long is answered
503 `store_busy`, not as an outage.

A retried write may run twice when its connection died after Redis applied it; the store's
writes are idempotent or compare-and-set for that reason (docs/architecture.md#redis-ha).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import NoBackoff

from controlplane.config import ConfigError, ServiceConfig
from controlplane.store.durable import DurableRedis, Replication
from controlplane.store.pool import BoundedPool, BoundedSentinelPool
from controlplane.store.redis import ensure_embedded_redis
from controlplane.store.retry import RetryWindow

log = structlog.get_logger(__name__)


def retry_window(config: ServiceConfig) -> float:
    """ACS_REDIS_RETRY_WINDOW, else 10 s with Sentinel (a failover takes Sentinel's
    down-after-milliseconds plus an election) and 2 s for a single Redis (a restart)."""
    if config.redis_retry_window is not None:
        return config.redis_retry_window
    return 10.0 if config.redis_sentinels else 2.0


def replication(config: ServiceConfig) -> Replication:
    """ACS_REDIS_WAIT_REPLICAS, else 1 with Sentinel (its master has replicas) and 0 without."""
    replicas = config.redis_wait_replicas
    if replicas is None:
        replicas = 1 if config.redis_sentinels else 0
    return Replication(replicas, config.redis_wait_timeout)


def _options(config: ServiceConfig, *, tcp: bool = True) -> dict[str, Any]:
    timeout = config.redis_timeout
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": min(timeout, 2.0),
        **({"socket_keepalive": True} if tcp else {}),  # a peer gone without a word
        "retry": RetryWindow(retry_window(config)),
        "health_check_interval": 30,
        "decode_responses": False,
    }


def _pool(config: ServiceConfig) -> dict[str, Any]:
    """The bounded pool's size and wait (store/pool.py): a burst waits for a connection."""
    return {"max_connections": config.redis_max_connections, "timeout": config.redis_pool_timeout}


def _credentials(config: ServiceConfig) -> dict[str, Any]:
    creds: dict[str, Any] = {}
    if config.redis_username:
        creds["username"] = config.redis_username
    if config.redis_password:
        creds["password"] = config.redis_password
    return creds


class FailoverConnection(SentinelManagedConnection):
    """Asks the Sentinels for the master at every connect, reconnects included.

    redis-py's own (8.1) does so only when the pool hands out a connection; a connection that
    broke mid-command reconnects, inside the command's retry, to the address it had, the dead
    master, until the retry gives up (redis/redis-py#3874)."""

    _discovering = False

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self.is_connected or self._discovering:
            await super().connect_check_health(check_health, retry_socket_connect)
            return
        self._discovering = True
        try:
            await self.connect()  # type: ignore[no-untyped-call]  # the master's address, then connect_to() → back here
        finally:
            self._discovering = False


class SentinelRedis(DurableRedis):
    """Closes the connections to the Sentinels with its own (redis-py leaves them open)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if isinstance(manager, Sentinel):
            await manager.aclose()


def sentinel_client(config: ServiceConfig) -> DurableRedis:
    """The master of ACS_REDIS_SENTINEL_MASTER, as the Sentinels name it at each (re)connect."""
    nodes = []
    for address in config.redis_sentinels:
        host, _, port = address.rpartition(":")
        nodes.append((host.strip("[]"), int(port)))
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": min(config.redis_timeout, 2.0),
        "socket_connect_timeout": min(config.redis_timeout, 1.0),
        # One attempt per Sentinel: the next Sentinel is the retry, and the command's
        # RetryWindow asks all of them again.
        "retry": Retry(NoBackoff(), 0),
    }
    if config.redis_sentinel_password:
        sentinel_kwargs["password"] = config.redis_sentinel_password
    sentinel = Sentinel(nodes, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(
        config.redis_sentinel_master,
        redis_class=SentinelRedis,
        connection_pool_class=BoundedSentinelPool,
        connection_class=FailoverConnection,
        db=config.redis_db,
        **_pool(config),
        **_options(config),
        **_credentials(config),
    )
    assert isinstance(client, DurableRedis)
    return client


def url_client(config: ServiceConfig, url: str) -> DurableRedis:
    """A client of the Redis at `url` on a bounded pool; ACS_REDIS_PASSWORD/USERNAME fill what
    it lacks."""
    try:
        pool = BoundedPool.from_url(
            url,
            **_pool(config),
            **_options(config, tcp=not url.startswith("unix:")),
            **_with_url(_credentials(config), url),
        )
    except ValueError as exc:
        raise ConfigError(f"ACS_REDIS_URL: {exc}") from None
    client = DurableRedis.from_pool(pool)
    assert isinstance(client, DurableRedis)
    return client


def _with_url(creds: dict[str, Any], url: str) -> dict[str, Any]:
    """Credentials the URL does not carry itself (its own win)."""
    parts = urlsplit(url)
    if parts.password:
        return {}
    if parts.username:
        creds.pop("username", None)
    return creds


async def open_redis(config: ServiceConfig) -> aioredis.Redis:
    """The client the control plane uses: Sentinel's master, the URL's Redis, or the embedded
    one (started on first use). Not connected yet: wait_for_redis() checks it."""
    if config.redis_sentinels:
        client = sentinel_client(config)
    else:
        url = config.redis_url
        if url is None:
            url = await asyncio.to_thread(ensure_embedded_redis, config.data_dir)
        client = url_client(config, url)
    client.replication = replication(config)
    return client
