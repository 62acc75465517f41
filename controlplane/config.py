"""Typed service configuration, read from the environment once by the CLI.

`create_app` never reads the environment itself: it takes a `ServiceConfig`. Field `x` is read
from `ACS_X`. The fields are grouped by concern, one model per group (their docstrings title the
groups of docs/configuration.md, which config_reference.py writes from these models), and
ServiceConfig is all of them in one flat model. The settings of a runtime are its own, declared
in its package (drivers/<runtime>/settings.py) and listed by drivers/runtimes.py: the chosen
runtime's (ACS_DRIVER) are read into `ServiceConfig.runtime` and handed to its driver whole.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from drivers.runtime import CommaList, KeyValues, RuntimeSettings, split_commas
from drivers.runtimes import DEFAULT_RUNTIME, RUNTIMES

ENV_PREFIX = "ACS_"


class ConfigError(Exception):
    """Configuration that cannot be used; the message names the variable."""


class Storage(BaseModel):
    """Storage and secrets"""

    redis_url: str | None = Field(
        default=None,
        description="Redis URL (`redis://…`, `rediss://…`, `unix://…`). Unset: the **embedded "
        "default**, a private `redis-server` with AOF persistence (`appendonly yes`, "
        "`appendfsync everysec`), listening only on the unix socket "
        "`$ACS_DATA_DIR/redis/redis.sock`, data in `$ACS_DATA_DIR/redis/`. It is started "
        "daemonised on first use and reused by later runs and by the CLI; stop it with "
        "`redis-cli -s var/redis/redis.sock shutdown`.",
    )
    redis_timeout: float = Field(
        default=5.0, gt=0, le=60, description="seconds per Redis operation before a 503"
    )
    redis_max_connections: int = Field(
        default=256,
        ge=2,
        le=10_000,
        description="connections to Redis this replica may hold at once (one pool; the events "
        "WebSocket's blocking reads have a second pool of the same size). A request whose "
        "command finds them all in use waits for one (`ACS_REDIS_POOL_TIMEOUT`); each is held "
        "only while a command runs, so a burst of a few hundred concurrent requests queues for "
        "milliseconds. Two pools per replica: keep twice this times the replicas under the Redis "
        "server's `maxclients` (10,000 by default)",
    )
    redis_pool_timeout: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="seconds a command waits for a free connection when all "
        "`ACS_REDIS_MAX_CONNECTIONS` are in use, then the request answers 503 `store_busy` "
        "with `Retry-After` (the replica is busy: not reported as Redis being down)",
    )
    redis_sentinels: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated `host:port` of Redis Sentinels: the master is the one they "
        "name (found again at every reconnect); `ACS_REDIS_URL` must then be unset "
        "([deployment](deployment.md#redis-through-sentinel))",
    )
    redis_sentinel_master: str = Field(
        default="mymaster",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="the master's name in the Sentinels' `sentinel monitor`",
    )
    redis_username: str | None = Field(default=None, description="ACL user of the Redis servers")
    redis_password: str | None = Field(
        default=None, description="password of the Redis servers; a URL's own password wins"
    )
    redis_sentinel_password: str | None = Field(
        default=None, description="the Sentinels' own password (`requirepass` of a Sentinel)"
    )
    redis_db: int = Field(
        default=0, ge=0, le=1023, description="database number with Sentinel (a URL names its own)"
    )
    redis_retry_window: float | None = Field(
        default=None,
        gt=0,
        le=300,
        description="seconds a Redis call is retried (with backoff) through an outage or a "
        "failover before the request answers 503",
        json_schema_extra={"shown_default": "`10` with Sentinel, `2` without"},
    )
    redis_wait_replicas: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="replicas that must hold what a request writes before it is answered (Redis "
        "`WAIT` after each write; `0`: no wait)",
        json_schema_extra={"shown_default": "`1` with Sentinel, `0` without"},
    )
    redis_wait_timeout: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="seconds a write waits for those replicas (after a failover, until Sentinel "
        "has pointed a replica at the new master and it has caught up), then 503",
    )
    data_dir: Path = Field(
        default=Path("var"),
        description="embedded Redis data, the secret key file, image build cache",
    )
    secret_key: str | None = Field(
        default=None,
        description="Fernet key encrypting secrets at rest. Unset: `$ACS_DATA_DIR/secret.key`, "
        "created on first run with mode 0600 and reused. Losing it makes stored secrets "
        "unreadable (requests that need them answer 500; nothing is overwritten).",
    )

    @field_validator("redis_sentinels")
    @classmethod
    def _host_ports(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if value and info.data.get("redis_url"):
            raise ValueError("set either ACS_REDIS_URL or ACS_REDIS_SENTINELS, not both")
        for address in value:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{address!r} is not host:port")
        return value


class Server(BaseModel):
    """The HTTP server"""

    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description="`json`, `console`, or `auto` (console on a TTY, JSON otherwise)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="`debug`, `info`, `warning`, `error`"
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="request body limit; larger bodies get 413",
    )
    request_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="seconds a request may take before a 504 (not WebSockets or streams)",
    )
    metrics_public: bool = Field(default=False, description="serve `/metrics` without an admin key")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="processes `controlplane serve` runs, each a whole replica on the same "
        "port (SO_REUSEPORT) under one supervisor; one uses one core "
        "([operations](operations.md#workers))",
    )
    event_loop: Literal["asyncio", "uvloop"] = Field(
        default="asyncio",
        description="`asyncio` (the standard library's loop) or `uvloop` (libuv's: 14-19 % less "
        "CPU a gateway call here; see [operations](operations.md#workers) before choosing it)",
    )
    shutdown_drain_delay: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description="seconds between SIGTERM (from which `/ready` answers 503) and closing the "
        "listener, for a balancer to stop sending "
        "([deployment](deployment.md#several-replicas-behind-one-address))",
    )
    shutdown_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="seconds requests in flight, conversation starts and sandbox launches get to "
        "finish at SIGTERM; what is left is handed over to another replica",
    )


class Access(BaseModel):
    """Authentication and browsers"""

    bootstrap_api_key: str | None = Field(
        default=None,
        min_length=16,
        description="an admin key accepted as-is (≥ 16 characters), for single-user installs",
    )
    bootstrap_user: str = Field(
        default="admin",
        pattern=r"^[A-Za-z0-9_.@-]{1,64}$",
        description="the user id the bootstrap key acts as",
    )
    auth_mode: Literal["api_key", "none"] = Field(
        default="api_key",
        description="`none`: requests from this machine without a key act as the bootstrap "
        "user; `serve` then refuses any non-loopback `--host` "
        "([api.md](api.md#single-user-mode))",
    )
    session_ttl: int = Field(
        default=12 * 3600,
        ge=60,
        le=30 * 86400,
        description="seconds a browser session (sign-in cookie) lasts, 60..2592000",
    )
    cors_origins: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated origins (`https://ui.example.com`) allowed to call the "
        "API from a browser, with credentials; unset: none ([api.md](api.md#cors)). New "
        "sandboxes get them too (`OH_ALLOW_CORS_ORIGINS_<n>`), so the same pages may call their "
        "agent servers directly "
        "([agent-protocol.md](agent-protocol.md#authentication-and-cors))",
    )
    device_code_ttl: int = Field(
        default=600,
        ge=60,
        le=3600,
        description="seconds a device code of `openhands login` stays valid, 60..3600",
    )
    device_poll_interval: int = Field(
        default=5,
        ge=1,
        le=60,
        description="seconds the device flow asks clients to wait between polls, 1..60",
    )
    web_app_dir: Path | None = Field(
        default=None,
        description="a built web app served at `/` for browsers: Agent Canvas's `build/` "
        "directory (`npm pack @openhands/agent-canvas@1.6.1`, then `package/build`), which then "
        "talks to this server with the browser session ([api.md](api.md#agent-canvas))",
    )

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        out = []
        for origin in value:
            normal = origin.rstrip("/").lower()
            # Exact origins only: a wildcard would hand every site the user's browser session.
            if not re.fullmatch(r"https?://[a-z0-9.\-\[\]:]+", normal):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path)")
            out.append(normal)
        return out


ROLE_NAMES = ("owner", "admin", "member", "auditor")


def _group_role(item: str) -> str:
    group, sep, target = item.partition("=")
    org, colon, role = target.rpartition(":")
    if not sep or not colon or not group.strip() or role not in ROLE_NAMES:
        raise ValueError(f"{item!r} is not group=organization:role (role: {', '.join(ROLE_NAMES)})")
    if not re.fullmatch(ORG_ID_PATTERN, org):
        raise ValueError(f"{org!r} in {item!r} is not an organization id ({ORG_ID_PATTERN})")
    return f"{group.strip()}={org}:{role}"


ORG_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class OpenIdConnect(BaseModel):
    """Sign-in through OpenID Connect, and organizations"""

    oidc_issuer: str | None = Field(
        default=None,
        description="the OpenID provider's issuer URL (`https://keycloak.example.com/realms/eng`); "
        "set, browsers sign in through it (discovery at `<issuer>/.well-known/"
        "openid-configuration`, which must name this issuer)",
    )
    oidc_client_id: str | None = Field(
        default=None, description="this service's client id at the provider"
    )
    oidc_client_secret: str | None = Field(
        default=None,
        description="its client secret (`client_secret_basic`); never logged nor answered",
    )
    oidc_scopes: CommaList[str] = Field(
        default_factory=lambda: ["openid", "email", "profile"],
        description="comma-separated scopes asked for; add `groups` (Okta) or `offline_access` "
        "(Okta, for a refresh token) as the provider needs",
    )
    oidc_user_claim: str = Field(
        default="sub",
        pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
        description="the ID token claim that is the user id here (`sub`, `email`, "
        "`preferred_username`); its value must be 1-64 letters, digits, `_.@-`",
    )
    oidc_groups_claim: str | None = Field(
        default="groups",
        pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
        description="the ID token claim listing the user's groups; unset: groups are not read",
    )
    oidc_group_roles: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated `group=organization:role` (roles: owner, admin, member, "
        "auditor): at each sign-in and refresh a user's roles in the organizations named here "
        "are set from their groups (the highest role wins; no group: removed from that "
        "organization); organizations not named here are managed through the API alone",
    )
    oidc_default_role: Literal["member", "auditor", "none"] = Field(
        default="member",
        description="role in the default organization of a provider user whose groups give "
        "them no organization; `none`: such users are refused at sign-in",
    )
    oidc_recheck_interval: int = Field(
        default=300,
        ge=5,
        le=86400,
        description="seconds between two checks of a browser session with the provider "
        "(refresh token grant): a user disabled or removed there loses access within this time "
        "(twice it while the provider cannot be reached)",
    )
    oidc_redirect_url: str | None = Field(
        default=None,
        description="the callback URL registered at the provider "
        "(`https://acs.example.com/auth/oidc/callback`); unset: this server's own address as "
        "the browser reached it",
    )
    oidc_auth_params: KeyValues = Field(
        default_factory=dict,
        description="extra authorization request parameters (`k=v,…`), e.g. Google's "
        "`access_type=offline,prompt=consent` for a refresh token",
    )
    oidc_display_name: str = Field(
        default="your organization's sign-in",
        max_length=80,
        description="what the sign-in page's button names (`Sign in with …`)",
    )
    oidc_timeout: float = Field(
        default=10.0, gt=0, le=60, description="seconds for one call to the provider"
    )
    api_key_sign_in: bool = Field(
        default=True,
        description="the sign-in page also takes an API key; `false` with a provider set: "
        "browsers sign in through the provider only (keys still work in headers)",
    )
    default_organization: str = Field(
        default="deployment",
        pattern=ORG_ID_PATTERN,
        description="the organization existing users, keys and records belong to (made at "
        "start; records written before organizations existed are its)",
    )

    @field_validator("oidc_group_roles")
    @classmethod
    def _group_roles(cls, value: list[str]) -> list[str]:
        return [_group_role(item) for item in value]

    @field_validator("oidc_issuer", "oidc_redirect_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s?#]+", value):
            raise ValueError(f"{value!r} is not an http(s) URL without query or fragment")
        return value

    def oidc_enabled(self) -> bool:
        return self.oidc_issuer is not None


class RateLimits(BaseModel):
    """Rate limits"""

    rate_limit_per_minute: int = Field(
        default=6000, ge=0, description="requests per API key per minute; `0` = off"
    )
    webhook_rate_limit_per_minute: int = Field(
        default=6000,
        ge=0,
        description="sandbox webhook requests per sandbox per minute (100/s); `0` = off "
        "([operations.md](operations.md#per-sandbox-webhook-rate-limit))",
    )
    auth_rate_limit_per_minute: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description="sign-ins and device codes per client address, device approvals per user, "
        "per minute",
    )
    unauthenticated_rate: float = Field(
        default=100.0,
        ge=0,
        description="requests per second (bursts of twice that) that may end without a "
        "principal before their answers wait for a slot; `0` = off "
        "([security](security.md#5-unauthenticated-traffic))",
    )


class Runtime(BaseModel):
    """The sandbox runtime and the specs"""

    driver: str = Field(
        default=DEFAULT_RUNTIME,
        description="where sandboxes run: `docker` (the engine of `ACS_DOCKER_URL`, "
        "[Docker](#docker) below) or `kubernetes` (pods in "
        "`ACS_KUBE_NAMESPACE`, [Kubernetes](#kubernetes) below; "
        "[deployment](deployment.md#sandboxes-on-kubernetes)); the runtimes are the rows of "
        "`drivers/runtimes.py`",
    )
    spec_dir: Path = Field(
        default=Path("specs"), description="directory of sandbox spec YAML files"
    )
    enable_specs: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated ids of specs written `enabled: false` (the shipped "
        "`openhands`) that the control plane offers and `make images` builds anyway; an id no "
        "spec file has stops start-up ([sandboxes](sandboxes.md#agent-kinds))",
    )
    base_image: str = Field(
        default="acs-base:bookworm",
        description="base of the bookworm sandbox images (`scripts/build-images.sh`); with a "
        "registry, `debian:bookworm-slim` works",
    )
    image_tag: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="tag of the images built from `specs/` (specs with `build:`), used by "
        "`scripts/build-images.sh` and the control plane instead of the spec's own tag; lets "
        "several checkouts (or versions) share one engine without replacing each other's images",
    )
    container_prefix: str = Field(
        default="acs-sandbox-",
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
        description="container and volume name prefix; also the `acs.prefix` label that scopes "
        "a deployment",
    )
    url_host: str = Field(
        default="127.0.0.1",
        description="host name used in `exposed_urls` (unless they point at the proxy: "
        "`ACS_SANDBOX_URLS`) and for health probes",
    )
    start_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="seconds for a new sandbox's agent server to answer `/health`",
    )
    reconcile_interval: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="seconds between full reconciliation sweeps (events are followed continuously)",
    )


class Isolation(BaseModel):
    """What sandboxes reach of the control plane and its host"""

    public_url: str | None = Field(
        default=None,
        description="base URL sandboxes post their webhooks to and call the LLM gateway at; unset: "
        "`http://host.docker.internal:<ACS_WEBHOOK_PORT>`, the webhook listener on their "
        "network's gateway. Set it only when the webhooks must go elsewhere (a control plane on "
        "another host); an address on this host must then be in `ACS_SANDBOX_HOST_PORTS` too",
    )
    webhook_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="port of the webhook listener, which answers only the webhook routes and "
        "which the runtime binds where sandboxes reach it (Docker: every sandbox network's "
        "gateway address); must differ from `--port` when `--host` is `0.0.0.0` or `::`; `0`: "
        "any free port",
        json_schema_extra={"shown_default": "`serve`'s `--port`"},
    )
    sandbox_host_ports: CommaList[int] = Field(
        default_factory=list,
        description="comma-separated TCP ports on the host that every sandbox may reach at "
        "`host.docker.internal` (e.g. `11434` for a model server); nothing else on the host is "
        "reachable but the webhook listener. The LLM gateway may call the host's own addresses "
        "(and the other replicas' hosts) on these ports only "
        "([llm-gateway.md](llm-gateway.md#where-the-gateway-may-connect))",
    )

    @field_validator("sandbox_host_ports")
    @classmethod
    def _port_range(cls, value: list[int]) -> list[int]:
        for port in value:
            if not 1 <= port <= 65535:
                raise ValueError(f"{port} is not a TCP port")
        return sorted(set(value))


DNS_NAME = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"


class Outbound(BaseModel):
    """Outbound connections made for users ([security](security.md#12-outbound-connections))"""

    outbound_allow: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated networks (CIDRs, addresses) and DNS names of your network "
        "that users' `llm_base_url` may reach (a company's model server): the LLM gateway "
        "connects to the internet, and to private addresses only here; a name admits the "
        "addresses it resolves to (looked up again every 30 s). Nothing here admits this "
        "host (that is `ACS_SANDBOX_HOST_PORTS`), link-local addresses, the sandbox networks, "
        "the cluster's ranges, Redis or the other replicas",
    )

    @field_validator("outbound_allow")
    @classmethod
    def _networks_or_names(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            try:
                out.append(str(ipaddress.ip_network(item, strict=False)))
                continue
            except ValueError:
                pass
            name = item.lower().rstrip(".")
            if not re.fullmatch(DNS_NAME, name):
                raise ValueError(f"{item!r} is neither a network (CIDR) nor a DNS name")
            out.append(name)
        return out


class SandboxProxy(BaseModel):
    """The sandbox proxy"""

    proxy_url: str | None = Field(
        default=None,
        description="the URL clients reach this control plane at (its balancer's, e.g. "
        "`https://acs.example.com`); sandbox links then point at its proxy "
        "([deployment](deployment.md#the-sandbox-proxy-and-the-public-url))",
    )
    sandbox_urls: Literal["auto", "direct", "proxy"] = Field(
        default="auto",
        description="where `exposed_urls` and `conversation_url` point: `direct` (the published "
        "host port), `proxy` (`ACS_PROXY_URL/sandboxes/{id}/proxy/…`, needs `ACS_PROXY_URL`); "
        "`auto`: `proxy` once `ACS_PROXY_URL` is set",
    )
    proxy_max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        le=16 * 1024**3,
        description="largest request body, and WebSocket message, the sandbox proxy forwards; "
        "413 above",
        json_schema_extra={"shown_default": "`67108864` (64 MiB)"},
    )
    proxy_read_timeout: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="seconds the proxy waits for a sandbox's answer to begin and between two of "
        "its chunks; 504 when nothing came",
    )

    @field_validator("proxy_url")
    @classmethod
    def _proxy_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"https?://[^/?#\s]+(/[^?#\s]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL without query or fragment")
        return value.rstrip("/")

    @field_validator("sandbox_urls")
    @classmethod
    def _links_need_a_url(cls, value: str, info: ValidationInfo) -> str:
        if value == "proxy" and not info.data.get("proxy_url"):
            raise ValueError("proxy needs ACS_PROXY_URL (the URL clients reach this API at)")
        return value


class Capacity(BaseModel):
    """Quotas and capacity"""

    max_running_per_user: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="STARTING + RUNNING sandboxes per user; `0` = no limit",
    )
    max_sandboxes_per_user: int = Field(
        default=20, ge=0, le=100_000, description="sandboxes per user in any state; `0` = no limit"
    )
    max_event_sockets_per_user: int = Field(
        default=32,
        ge=0,
        le=10_000,
        description="live events WebSockets one user may hold open on one replica (each "
        "conversation watched on a replica blocks on a connection of the events reader pool, "
        "`ACS_REDIS_MAX_CONNECTIONS`, which all users share; sockets on one conversation share "
        "it); past it a new socket answers 429 with `Retry-After`; `0` = no limit",
    )
    host_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="memory all STARTING/RUNNING/PAUSED sandboxes (and warm pool members) may "
        "reserve, each its spec's `resources.memory_reservation` (default 64 MiB), not its "
        "limit; unset: `ACS_HOST_MEMORY_FRACTION` of the engine's total",
    )
    host_memory_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1.0,
        description="the part of the engine's total memory sandboxes may reserve when "
        "`ACS_HOST_MEMORY_BYTES` is unset",
    )
    max_concurrent_starts: int | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="sandboxes one replica boots at once (new ones from a cold start, resumes "
        "that re-create or restart, rewinds, warm pool members); the others wait their turn "
        "in order, STARTING, and `ACS_START_TIMEOUT` counts from their turn; unset: 2 per CPU "
        "of this host on Docker (split among `ACS_WORKERS`), no bound on Kubernetes; `0` = no "
        "bound "
        "([sandboxes](sandboxes.md#cold-starts-in-a-burst))",
    )
    max_queued_starts: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="user starts that may wait on one replica beyond the "
        "`ACS_MAX_CONCURRENT_STARTS` booting; past them a create, resume or rewind that must "
        "boot answers 503 `start_queue_full` with `Retry-After` at once, nothing created; "
        "unset: 25 per concurrent start",
    )


class Upkeep(BaseModel):
    """Idle sandboxes, retention and the warm pool"""

    idle_timeout: int | None = Field(
        default=None,
        ge=0,
        description="seconds of idleness before auto-pause, overriding specs and users; `0` "
        "disables",
    )
    reaper_interval: float = Field(
        default=30.0, gt=0, le=3600, description="seconds between idle reaper passes"
    )
    paused_retention: int = Field(
        default=0,
        ge=0,
        description="delete sandboxes paused longer than this many seconds; `0` = never",
    )
    warm_pool: dict[str, int] | None = Field(
        default=None,
        description="warm pool sizes overriding the specs' `warm_pool`: `N` for every spec, or "
        "`spec=N,...` with `*=N` for the rest; `0` turns a pool off "
        "([sandboxes](sandboxes.md#warm-pool))",
    )
    idle_action: Literal["pause", "hibernate"] = Field(
        default="pause",
        description="what the idle reaper does to an idle sandbox: `pause` (frozen, memory "
        "kept, resumes at once) or `hibernate` (paused, then its memory given back: Docker "
        "stops the container; resume restarts it, [sandboxes](sandboxes.md#hibernation))",
    )
    hibernate_after: int = Field(
        default=0,
        ge=0,
        description="seconds a sandbox stays PAUSED before it gives its memory back "
        "(hibernated; the API still says PAUSED); `0` = never",
    )
    pool_interval: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="seconds between the pool refiller's passes (it also runs right after a claim)",
    )
    pool_refill_delay: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="seconds without a claim (on any replica) before the pool refiller boots "
        "replacements: a burst of claims is served before its replacements boot on the same "
        "cores (held at most ten times this during a steady stream of claims); `0` = at once "
        "([sandboxes](sandboxes.md#warm-pool))",
    )
    pool_share_window: float = Field(
        default=60.0,
        ge=1,
        le=86400,
        description="seconds of the windows in which an organization's `warm_pool_share` "
        "(PATCH /api/organizations/{id}) counts its claims of each spec's warm pool",
    )

    @field_validator("warm_pool", mode="before")
    @classmethod
    def _pool_sizes(cls, value: Any) -> Any:
        if not isinstance(value, str | int):
            return value
        text = str(value).strip()
        if "=" not in text:
            return {"*": text}
        sizes: dict[str, str] = {}
        for part in split_commas(text):
            spec, sep, size = part.partition("=")
            if not sep or not spec.strip():
                raise ValueError(f"{part!r} is not spec=N")
            sizes[spec.strip()] = size.strip()
        return sizes

    @field_validator("warm_pool")
    @classmethod
    def _pool_range(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for spec, size in (value or {}).items():
            if not 0 <= size <= 1000:
                raise ValueError(f"pool size {size} for {spec} is not between 0 and 1000")
        return value

    def pool_size(self, spec_id: str, spec_size: int) -> int:
        """The warm pool size of one spec: this override when set, else the spec's own."""
        if self.warm_pool is None:
            return spec_size
        return self.warm_pool.get(spec_id, self.warm_pool.get("*", spec_size))


class Snapshots(BaseModel):
    """Snapshots and hibernation"""

    snapshot_store_url: str | None = Field(
        default=None,
        description="the OCI registry snapshots are stored in (`https://registry.example.com`, "
        "any registry speaking the distribution API v2, with blob and manifest deletion "
        "enabled); unset: snapshots are off (their routes answer 503)",
    )
    snapshot_store_repository: str = Field(
        default="acs-snapshots",
        pattern=r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$",
        description="repository prefix in the registry: each user's snapshots are under "
        "`<prefix>/u<24 hex digits>` (a keyed hash of the user id)",
    )
    snapshot_store_username: str | None = Field(
        default=None, description="user for the registry (Basic, or its token service)"
    )
    snapshot_store_password: str | None = Field(default=None, description="its password")
    snapshot_store_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="seconds one request to the registry may take (a blob of up to "
        "`ACS_SNAPSHOT_PACK_BYTES`) before the operation answers 503",
    )
    snapshot_pack_bytes: int = Field(
        default=16 * 1024**2,
        ge=1024**2,
        le=512 * 1024**2,
        description="size of the packs (blobs) a snapshot's new chunks are sent in",
    )
    snapshot_helper_image: str | None = Field(
        default=None,
        description="image of the helper containers that read and write sandboxes' files for "
        "snapshots (any with python3 ≥ 3.9); unset: `ACS_BASE_IMAGE`",
    )
    snapshot_max_per_user: int = Field(
        default=100, ge=0, description="snapshots a user may keep; `0` = no limit"
    )
    snapshot_max_bytes_per_user: int = Field(
        default=10 * 1024**3,
        ge=0,
        description="bytes a user's snapshots may take in the store (after deduplication and "
        "compression); `0` = no limit",
    )
    snapshot_max_changed_bytes: int = Field(
        default=16 * 1024**3,
        ge=0,
        description="bytes of changed files one snapshot may copy out of a sandbox (their "
        "listed sizes, a sparse file's whole length included), checked before anything is "
        "copied: over it, 413 `snapshot_too_large`. It bounds the helper's staging on the "
        "engine's disk; `0` = no limit. A fork's snapshot on Docker copies the whole "
        "workspace (the forks' base is built from it); over this it copies what changed, "
        "and the forks read the store",
    )
    snapshot_keep_last: int = Field(
        default=10,
        ge=0,
        description="unnamed snapshots kept per sandbox (older ones are deleted); `0` = no "
        "limit. Named ones are kept until deleted",
    )
    snapshot_max_age: int = Field(
        default=30 * 86400,
        ge=0,
        description="seconds an unnamed snapshot is kept; `0` = no limit",
    )
    snapshot_orphan_retention: int = Field(
        default=7 * 86400,
        ge=0,
        description="seconds the unnamed snapshots of a deleted sandbox are kept after the "
        "retention pass first finds it gone; `0`: deleted with it",
    )
    snapshot_collect_interval: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="seconds between the collector's passes (abandoned snapshots, unused "
        "blobs, retention; one replica at a time)",
    )
    snapshot_collect_grace: float = Field(
        default=600.0,
        ge=0,
        le=30 * 86400,
        description="seconds a blob no snapshot uses any more is kept before it is deleted "
        "(a snapshot being taken may still reuse it)",
    )
    snapshot_upload_settle: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description="seconds after a snapshot is abandoned (a failure, a cancel, a replica's "
        "death) during which the collector keeps asking the store to delete what it was "
        "sending even when the store says it does not hold it: an upload whose bytes the "
        "store had when the sender gave up may still land",
    )
    checkpoint_keep_last: int = Field(
        default=20,
        ge=0,
        description="checkpoints kept per conversation (one is taken at each user message; "
        "older ones are deleted with their snapshots); `0` = no limit (the per-user snapshot "
        "limits still apply)",
    )
    checkpoint_capture_wait: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="seconds a user's message waits for its checkpoint's files to be read "
        "(the sandbox held still) before it goes to the agent; past that the checkpoint is "
        "given up and the message goes",
    )
    snapshot_lease: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="seconds a snapshot being taken is considered alive without news from "
        "its replica; then it is abandoned and what it sent is collected",
    )

    @field_validator("snapshot_store_url")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"https?://[^/?#\s]+", value.rstrip("/")):
            raise ValueError(f"{value!r} is not an http(s) URL of a registry (no path)")
        return value.rstrip("/")


class AuditLogSettings(BaseModel):
    """Audit log"""

    audit_retention: float = Field(
        default=30 * 86400,
        ge=3600,
        le=400 * 86400,
        description="seconds audit entries are kept in Redis (searchable); the sinks keep the "
        "long-term copy. Default 30 days: about 551 bytes an entry with its indexes, so 10,000 "
        "entries a day take about 165 MB ([operations.md](operations.md#the-audit-log))",
    )
    audit_sink_urls: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated URLs receiving every audit entry (a JSON POST each, signed "
        "as lifecycle webhooks are, at least once, through the outbound policy)",
    )
    audit_sink_secret: str | None = Field(
        default=None,
        min_length=16,
        description="HMAC-SHA256 key of the audit sinks' `X-ACS-Signature` (16+ characters)",
    )
    audit_anonymous_per_source: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="anonymous failures (a failed sign-in nobody authenticated) one source "
        "writes to the audit log a window; an IPv6 source is its /64. Past it, or past "
        "ACS_AUDIT_ANONYMOUS_PER_WINDOW, they are counted, and one `audit.dropped` entry a "
        "window says how many ([operations.md](operations.md#the-audit-log))",
    )
    audit_anonymous_per_window: int = Field(
        default=100,
        ge=1,
        le=1_000_000,
        description="anonymous failures written to the audit log a window, from every source "
        "together: the log takes at most this + 1 of them a window, whatever the traffic",
    )
    audit_anonymous_window: float = Field(
        default=60.0,
        ge=1.0,
        le=86400.0,
        description="seconds of the windows of ACS_AUDIT_ANONYMOUS_PER_SOURCE and _PER_WINDOW",
    )
    audit_stdout: bool = Field(
        default=False,
        description="also write every audit entry to standard output, one JSON line each (the "
        "Elastic Common Schema a SIEM's log shipper takes as it is)",
    )

    @field_validator("audit_sink_urls")
    @classmethod
    def _sink_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value


class LifecycleWebhooks(BaseModel):
    """Lifecycle webhooks"""

    lifecycle_webhook_urls: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated URLs receiving lifecycle events",
    )
    lifecycle_webhook_secret: str | None = Field(
        default=None,
        min_length=16,
        description="HMAC-SHA256 key for their `X-ACS-Signature` (16+ characters)",
    )
    lifecycle_webhook_retry_base: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="seconds before the first retry of a failed delivery; doubles per attempt "
        "([operations.md](operations.md#the-webhook-outbox))",
    )
    lifecycle_webhook_retry_max: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="longest wait between two attempts, seconds",
    )
    lifecycle_webhook_timeout: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="seconds one delivery attempt may take; retries never come sooner than "
        "this plus 2 s",
    )
    lifecycle_webhook_dead_after: float = Field(
        default=86400.0,
        gt=0,
        le=30 * 86400,
        description="age in seconds after which an undelivered event is dead-lettered",
    )

    @field_validator("lifecycle_webhook_urls")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value


class Models(BaseModel):
    """LLM prices and the models the web frontend offers"""

    llm_prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description='JSON `{"model": [input, output]}` USD per token, for cost and budgets; '
        "an unknown model costs 0 (the LLM gateway looks a model up as configured, then without "
        "its provider prefix; a model it calls through LiteLLM and finds here under neither "
        "costs what LiteLLM's own table says)",
    )
    llm_models: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated models (`provider/model`, e.g. `openai/gpt-4o`) the web "
        "frontend offers as **verified**; its model lists also hold `ACS_LLM_PRICES`' models and "
        "each user's own `llm_model` ([api.md](api.md#the-web-frontend))",
    )

    @field_validator("llm_prices", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        return value

    @field_validator("llm_prices")
    @classmethod
    def _prices(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for model, pair in value.items():
            if not all(math.isfinite(price) and price >= 0 for price in pair):
                raise ValueError(f"{model}: prices are non-negative numbers")
        return value


class LlmGateway(BaseModel):
    """The LLM gateway ([llm-gateway.md](llm-gateway.md))"""

    llm_gateway_direct: bool = Field(
        default=True,
        description="the LLM gateway calls OpenAI-compatible providers directly; `false`: every "
        "call through LiteLLM ([llm-gateway.md](llm-gateway.md#providers))",
    )
    llm_gateway_timeout: float = Field(
        default=600.0,
        gt=0,
        le=3600,
        description="seconds a model call may take through the gateway, and a stream may stay "
        "silent",
    )
    llm_gateway_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="retries of a call the provider answered 408/409/429/5xx or could not be "
        "reached for",
    )
    llm_gateway_backoff: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="seconds before the first retry; doubles, jittered, at most 30 s (a "
        "provider's `Retry-After` honoured up to that)",
    )
    llm_gateway_max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        le=512 * 1024 * 1024,
        description="body limit of a model call (the API's `ACS_MAX_BODY_BYTES` does not apply "
        "to the gateway's routes: a long conversation is larger)",
        json_schema_extra={"shown_default": "`33554432` (32 MiB)"},
    )
    llm_translator_memory_bytes: int = Field(
        default=4 * 1024 * 1024 * 1024,
        ge=0,
        le=1 << 40,
        description="address space (RLIMIT_AS) of the LiteLLM translator process: past it an "
        "allocation fails and the call answers 502, or the process dies and the next call starts "
        "another, whatever a provider answers (a gzip bomb); `0`: no limit "
        "([llm-gateway.md](llm-gateway.md#answers-the-gateway-does-not-trust))",
        json_schema_extra={"shown_default": "`4294967296` (4 GiB)"},
    )
    llm_rate_limit_per_minute: int = Field(
        default=600,
        ge=0,
        description="model calls per user per minute through the gateway (every replica counts "
        "in Redis); `0`: off",
    )
    llm_user_monthly_budget: float | None = Field(
        default=None,
        ge=0,
        description="USD a user may spend through the gateway per calendar month (UTC), "
        "sandboxes and own tools together; unset: no limit",
    )


GROUPS: tuple[type[BaseModel], ...] = (
    Storage,
    Server,
    Access,
    OpenIdConnect,
    RateLimits,
    Runtime,
    Isolation,
    Outbound,
    SandboxProxy,
    *(runtime.settings for runtime in RUNTIMES.values()),
    Capacity,
    Upkeep,
    Snapshots,
    LifecycleWebhooks,
    AuditLogSettings,
    Models,
    LlmGateway,
)
"""The groups, in the order docs/configuration.md lists them: every runtime's settings (declared
in its package under drivers/) after the control plane's runtime-neutral ones."""

RUNTIME_SETTINGS = {name: runtime.settings for name, runtime in RUNTIMES.items()}
SETTING_NAMES = frozenset(name for group in GROUPS for name in group.model_fields)
"""Every setting `x` (the variable ACS_X), of the control plane and of every runtime."""


class ServiceConfig(
    LlmGateway,
    Models,
    LifecycleWebhooks,
    AuditLogSettings,
    Snapshots,
    Upkeep,
    Capacity,
    SandboxProxy,
    Outbound,
    Isolation,
    Runtime,
    RateLimits,
    OpenIdConnect,
    Access,
    Server,
    Storage,
):
    """Everything the control plane needs to run: every group's fields in one model, and the
    settings of the runtime ACS_DRIVER names in `runtime` (given flat like the others, e.g.
    `docker_url=`, they are moved there; those of runtimes not chosen are not read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: RuntimeSettings = Field(exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _runtime_settings(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or isinstance(data.get("runtime"), RuntimeSettings):
            return data
        driver = str(data.get("driver") or DEFAULT_RUNTIME)
        chosen = RUNTIME_SETTINGS.get(driver)
        if chosen is None:
            raise ValueError(f"ACS_DRIVER: {driver!r} is none of {', '.join(RUNTIME_SETTINGS)}")
        own = cls.model_fields
        values = {k: v for k, v in data.items() if k in own or k not in SETTING_NAMES}
        try:
            values["runtime"] = chosen.model_validate(
                {k: v for k, v in data.items() if k in chosen.model_fields}
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = f"{ENV_PREFIX}{str(first['loc'][0]).upper()}: " if first["loc"] else ""
            raise ValueError(where + str(first["msg"]).removeprefix("Value error, ")) from None
        return values

    @model_validator(mode="after")
    def _runtime_rules(self) -> ServiceConfig:
        if not isinstance(self.runtime, RUNTIME_SETTINGS[self.driver]):
            raise ValueError(f"ACS_DRIVER: the settings given are not {self.driver}'s")
        self.runtime.check(self.container_prefix)
        return self

    @model_validator(mode="after")
    def _oidc(self) -> ServiceConfig:
        if self.oidc_issuer is not None and not self.oidc_client_id:
            raise ValueError("ACS_OIDC_CLIENT_ID: needed with ACS_OIDC_ISSUER")
        if self.oidc_issuer is not None and "openid" not in self.oidc_scopes:
            raise ValueError("ACS_OIDC_SCOPES: must include `openid`")
        return self


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in SETTING_NAMES:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            values[name] = raw
    return values


def load_config(environ: Mapping[str, str] | None = None, **overrides: Any) -> ServiceConfig:
    """Build the configuration from `ACS_*` variables plus explicit overrides.

    Raises ConfigError with one line naming the offending variable.
    """
    values = _from_env(os.environ if environ is None else environ)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ServiceConfig.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a rule across fields: its message names the variables
            raise ConfigError(str(first["msg"]).removeprefix("Value error, ")) from None
        field = str(first["loc"][0])
        raise ConfigError(f"{ENV_PREFIX}{field.upper()}: {first['msg']}") from None
