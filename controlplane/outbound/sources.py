"""The outbound policy's inputs, kept current: read at start-up, then every half minute.

- the ports of this host a user may call (ACS_SANDBOX_HOST_PORTS) and the operator's allow-list
  (ACS_OUTBOUND_ALLOW: its names looked up again at every refresh);
- the sandbox networks, as the driver tells them (drivers/base.py: `sandbox_networks`);
- Redis and its Sentinels: the endpoints configured, the master's own address as it tells
  it (`CLIENT INFO`) and its replicas (`INFO replication`);
- the other replicas: each writes its host's addresses to Redis (keyspace.REPLICA_ADDRESSES)
  and reads the others'.

A source that fails keeps its last answer (and says so in the log): a Docker engine or a Redis
that is away for a moment does not open what it fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
import structlog

from controlplane.background import stop_tasks
from controlplane.config import ServiceConfig
from controlplane.outbound.policy import IPNetwork, OutboundPolicy, Rules, canonical
from controlplane.store import keyspace, text

log = structlog.get_logger(__name__)

REFRESH_INTERVAL = 30.0
PEER_FRESH = 120.0
"""A replica's addresses count while it renewed them this recently (it renews every 30 s)."""
PEER_FORGET = 86400.0
"""An entry not renewed for this long is deleted (a replica that died without a word)."""
LOOKUP_TIMEOUT = 5.0

NetworksOf = Callable[[], Awaitable[list[str]]]


def local_addresses() -> list[str]:
    """This host's addresses, but loopback and link-local ones (Linux: /proc/net; elsewhere
    none)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        previous = ""
        for line in Path("/proc/net/fib_trie").read_text().splitlines():
            if line.strip() == "/32 host LOCAL" and previous:
                found.append(previous)
            previous = line.split("|-- ", 1)[1].strip() if "|-- " in line else ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.append(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    kept = {
        a
        for a in found
        if not ipaddress.ip_address(a).is_loopback and not ipaddress.ip_address(a).is_link_local
    }
    return sorted(kept)


async def lookup(name: str) -> list[str]:
    """Every address `name` resolves to (IPv4 and IPv6); [] when it does not."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), LOOKUP_TIMEOUT
        )
    except (OSError, TimeoutError):
        return []
    return sorted({canonical(str(info[4][0])) for info in infos})


def _host_port(address: str, default: int) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    if not host:
        return None
    try:
        return host.strip("[]"), int(port or default)
    except ValueError:
        return None


def _configured_redis(config: ServiceConfig) -> list[tuple[str, int]]:
    """The Redis and Sentinel endpoints of the configuration (names unresolved)."""
    found: list[tuple[str, int]] = []
    if config.redis_url:
        parts = urlsplit(config.redis_url)
        if parts.scheme in ("redis", "rediss") and parts.hostname:
            found.append((parts.hostname, parts.port or 6379))
    for sentinel in config.redis_sentinels:
        pair = _host_port(sentinel, 26379)
        if pair is not None:
            found.append(pair)
    return found


class OutboundSources:
    """The user and operator policies of this replica, and what keeps the first current."""

    def __init__(
        self,
        config: ServiceConfig,
        redis: aioredis.Redis | None,
        networks: NetworksOf | None = None,
        *,
        interval: float = REFRESH_INTERVAL,
    ) -> None:
        self._config = config
        self._redis = redis
        self._networks = networks
        self._interval = interval
        self.user = OutboundPolicy(Rules(host_ports=frozenset(config.sandbox_host_ports)))
        self.operator = OutboundPolicy(scope="operator")
        self.rules_json = self.user.rules.to_json()
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._last: dict[str, Any] = {}
        self._names: dict[str, list[str]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(), name="outbound-sources")]

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.hdel(keyspace.REPLICA_ADDRESSES, self.replica_id)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.refresh()

    async def refresh(self) -> None:
        """Every input asked again, the policy updated (its cached decisions dropped: an address
        of this host may have come or gone too)."""
        allow_networks, allow_names = self._allow()
        named = await self._kept("allow", self._allowed_names(allow_names))
        internal = await self._kept("internal", self._internal())
        endpoints = await self._kept("endpoints", self._endpoints())
        peers = await self._kept("peers", self._peers())
        rules = Rules(
            host_ports=frozenset(self._config.sandbox_host_ports),
            allow=(*allow_networks, *named),
            internal=tuple(internal),
            endpoints=frozenset(endpoints),
            peers=frozenset(peers),
        )
        if rules != self.user.rules:
            log.info(
                "outbound_rules",
                allow=[str(n) for n in rules.allow],
                internal=[str(n) for n in rules.internal],
                endpoints=sorted(f"{a}:{p}" for a, p in rules.endpoints),
                peers=sorted(rules.peers),
            )
            self.rules_json = rules.to_json()
        self.user.update(rules)

    async def _kept(self, name: str, answer: Awaitable[Any]) -> Any:
        """A source's answer, or its last one when it fails now."""
        try:
            self._last[name] = await answer
        except Exception as exc:  # any failure of a source: what was known is kept
            log.warning("outbound_source_failed", source=name, error=f"{type(exc).__name__}: {exc}")
        return self._last.get(name, [])

    def _allow(self) -> tuple[list[IPNetwork], list[str]]:
        networks: list[IPNetwork] = []
        names: list[str] = []
        for item in self._config.outbound_allow:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                names.append(item)
        return networks, names

    async def _allowed_names(self, names: list[str]) -> list[IPNetwork]:
        """The addresses of the allow-list's names; a name that does not resolve now keeps
        those it had (a DNS hiccup does not cut a company's model server off)."""
        found = await asyncio.gather(*(lookup(name) for name in names))
        for name, addresses in zip(names, found, strict=True):
            if addresses:
                self._names[name] = addresses
        return [ipaddress.ip_network(a) for name in names for a in self._names.get(name, [])]

    async def _internal(self) -> list[IPNetwork]:
        if self._networks is None:
            return []
        networks = [ipaddress.ip_network(n, strict=False) for n in await self._networks()]
        v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
        v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
        return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]

    async def _endpoints(self) -> set[tuple[str, int]]:
        named = _configured_redis(self._config)
        if self._redis is not None:
            named.extend(await self._kept("redis", self._redis_told()))
        found: set[tuple[str, int]] = set()
        for host, port in named:
            try:
                found.add((canonical(host), port))
            except ValueError:
                found.update((a, port) for a in await lookup(host))
        return found

    async def _redis_told(self) -> list[tuple[str, int]]:
        """The master's own address (`laddr`: where it took our connection) and its replicas."""
        assert self._redis is not None
        told: list[tuple[str, int]] = []
        laddr = (await self._redis.client_info()).get("laddr")
        pair = _host_port(text(laddr), 6379) if laddr else None
        if pair is not None and pair[1]:
            told.append(pair)
        info: dict[str, Any] = await self._redis.info("replication")
        for key, value in info.items():
            if key.startswith("slave") and isinstance(value, dict) and "ip" in value:
                told.append((str(value["ip"]), int(value["port"])))
        if info.get("master_host"):
            told.append((str(info["master_host"]), int(info.get("master_port", 6379))))
        return told

    async def _peers(self) -> set[str]:
        """The other replicas' host addresses (this one's written for them first)."""
        if self._redis is None:
            return set()
        now = time.time()
        entry = json.dumps({"addresses": local_addresses(), "at": now})
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(keyspace.REPLICA_ADDRESSES, self.replica_id, entry)
            pipe.hgetall(keyspace.REPLICA_ADDRESSES)
            _, entries = await pipe.execute()
        peers: set[str] = set()
        gone: list[str] = []
        for raw_id, raw in entries.items():
            replica = text(raw_id)
            if replica == self.replica_id:
                continue
            try:
                data = json.loads(raw)
                seen = float(data["at"])
                addresses = [canonical(str(a)) for a in data["addresses"]]
            except (ValueError, KeyError, TypeError):
                gone.append(replica)
                continue
            if now - seen > PEER_FORGET:
                gone.append(replica)
            elif now - seen <= PEER_FRESH:
                peers.update(addresses)
        if gone:
            await self._redis.hdel(keyspace.REPLICA_ADDRESSES, *gone)
        return peers
