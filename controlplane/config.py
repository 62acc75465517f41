"""Typed service configuration, read from the environment once by the CLI.

`create_app` never reads the environment itself: it takes a `ServiceConfig`.
"""

from __future__ import annotations

import ipaddress
import json
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
)

ENV_PREFIX = "ACS_"


class ConfigError(Exception):
    """Configuration that cannot be used; the message names the variable."""


class ServiceConfig(BaseModel):
    """Everything the control plane needs to run. Field `x` is read from `ACS_X`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    redis_url: str | None = Field(
        default=None, description="Redis URL; unset starts an embedded redis-server in data_dir"
    )
    data_dir: Path = Field(default=Path("var"), description="Embedded Redis data, key file")
    bootstrap_api_key: str | None = Field(
        default=None, min_length=16, description="An admin API key accepted as-is"
    )
    bootstrap_user: str = Field(default="admin", pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    secret_key: str | None = Field(
        default=None, description="Fernet key for secrets at rest; unset uses data_dir/secret.key"
    )
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    redis_timeout: float = Field(default=5.0, gt=0, le=60)

    # Sandboxes (Docker).
    docker_url: str | None = Field(default=None, description="Docker daemon URL; unset: from env")
    docker_threads: int = Field(default=8, ge=1, le=64)
    docker_quick_threads: int = Field(default=4, ge=1, le=64)
    spec_dir: Path = Path("specs")
    enable_specs: list[str] = Field(
        default_factory=list, description="Comma-separated ids of `enabled: false` specs to offer"
    )
    base_image: str = "acs-base:bookworm"
    image_tag: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="Tag of the images built from specs/ instead of the spec's own tag",
    )
    container_prefix: str = Field(default="acs-sandbox-", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
    publish_host: str = Field(default="127.0.0.1", description="Host address ports publish on")
    url_host: str = Field(default="127.0.0.1", description="Host name used in exposed_urls")
    max_running_per_user: int = Field(default=5, ge=0, le=1000)
    start_timeout: float = Field(default=60.0, gt=0, le=3600)
    reconcile_interval: float = Field(default=10.0, gt=0, le=3600)
    # Operations (docs/operations.md).
    max_sandboxes_per_user: int = Field(default=20, ge=0, le=100_000, description="0: no limit")
    host_memory_bytes: int | None = Field(
        default=None, ge=0, description="Memory sandboxes may reserve; unset: the engine's total"
    )
    host_memory_fraction: float = Field(default=0.9, gt=0, le=1.0)
    host_memory_floor: int = Field(
        default=512 * 1024**2,
        ge=0,
        description="Refuse new sandboxes while the host has less memory available than this "
        "(a local engine only); 0: off",
    )
    idle_timeout: int | None = Field(
        default=None, ge=0, description="Seconds; overrides every spec and user; 0 disables"
    )
    reaper_interval: float = Field(default=30.0, gt=0, le=3600)
    warm_pool: dict[str, int] | None = Field(
        default=None,
        description="Warm pool sizes overriding the specs': `N` for every spec, or "
        "`spec=N,...` (`*=N` for the rest); 0 turns a pool off; unset: each spec's `warm_pool`",
    )
    pool_interval: float = Field(
        default=2.0, gt=0, le=3600, description="Seconds between the pool refiller's passes"
    )
    paused_retention: int = Field(
        default=0, ge=0, description="Delete sandboxes paused longer than this (s); 0: never"
    )
    rate_limit_per_minute: int = Field(
        default=6000, ge=0, description="Requests per API key per minute (100/s); 0: off"
    )
    webhook_rate_limit_per_minute: int = Field(
        default=6000, ge=0, description="Webhook requests per sandbox per minute (100/s); 0: off"
    )
    request_timeout: float = Field(default=60.0, gt=0, le=3600)
    unauthenticated_rate: float = Field(
        default=100.0,
        ge=0,
        description="Requests per second without a key before their answers wait; 0: off",
    )
    lifecycle_webhook_urls: list[str] = Field(default_factory=list)
    lifecycle_webhook_secret: str | None = Field(default=None, min_length=16)
    lifecycle_webhook_retry_base: float = Field(
        default=1.0, gt=0, le=3600, description="Seconds before the first retry; doubles after"
    )
    lifecycle_webhook_retry_max: float = Field(
        default=300.0, gt=0, le=86400, description="Longest wait between two retries (s)"
    )
    lifecycle_webhook_timeout: float = Field(
        default=10.0, gt=0, le=300, description="Seconds one delivery attempt may take"
    )
    lifecycle_webhook_dead_after: float = Field(
        default=86400.0,
        gt=0,
        le=30 * 86400,
        description="Age (s) at which a failing event is dead-lettered",
    )
    metrics_public: bool = Field(default=False, description="Serve /metrics without a key")
    llm_prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description='JSON {"model": [input USD per token, output USD per token]}; unknown = 0',
    )
    llm_models: list[str] = Field(
        default_factory=list,
        description="Comma-separated LLM models the web frontend offers as verified "
        "(its lists also hold ACS_LLM_PRICES' models and each user's own)",
    )
    public_url: str | None = Field(
        default=None,
        description="URL sandboxes use to reach the webhooks; unset: the webhook listener's",
    )
    # Sandbox isolation (docs/security.md).
    webhook_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the webhook listener on the sandbox network's gateway; "
        "unset: serve's --port; 0: any free port",
    )
    sandbox_subnet_pool: str = Field(
        default="10.213.0.0/16", description="Where the sandbox networks' subnets are carved from"
    )
    sandbox_subnet_size: int = Field(
        default=22,
        ge=16,
        le=28,
        description="Prefix length; a /22 holds 1,021 sandboxes (a /24 only 253, fewer than "
        "the ~345 idle ones admission admits on a 24 GiB host)",
    )
    host_firewall: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Manage iptables rules for the sandbox networks; auto: when root with iptables",
    )
    sandbox_host_ports: list[int] = Field(
        default_factory=list,
        description="Host ports every sandbox may reach at host.docker.internal (a model server)",
    )
    # Browsers and the CLI's sign-in (docs/api.md#authentication).
    auth_mode: Literal["api_key", "none"] = Field(
        default="api_key",
        description="none: loopback requests without a key act as the bootstrap user",
    )
    session_ttl: int = Field(default=12 * 3600, ge=60, le=30 * 86400, description="Seconds")
    cors_origins: list[str] = Field(default_factory=list, description="Comma-separated origins")
    device_code_ttl: int = Field(default=600, ge=60, le=3600, description="Seconds")
    device_poll_interval: int = Field(default=5, ge=1, le=60, description="Seconds")
    auth_rate_limit_per_minute: int = Field(
        default=30, ge=1, le=100_000, description="Sign-ins, device codes, approvals per minute"
    )
    # High availability (docs/deployment.md#high-availability).
    redis_sentinels: list[str] = Field(
        default_factory=list,
        description="Comma-separated host:port of Redis Sentinels; the master is found through "
        "them (ACS_REDIS_URL must then be unset)",
    )
    redis_sentinel_master: str = Field(
        default="mymaster", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Sentinel's name"
    )
    redis_username: str | None = Field(default=None, description="ACL user of the Redis servers")
    redis_password: str | None = Field(
        default=None, description="Password of the Redis servers; a URL's own password wins"
    )
    redis_sentinel_password: str | None = Field(default=None, description="The Sentinels' own")
    redis_db: int = Field(default=0, ge=0, le=1023, description="Database number with Sentinel")
    redis_retry_window: float | None = Field(
        default=None,
        gt=0,
        le=300,
        description="Seconds a Redis call is retried through an outage or failover before its "
        "request answers 503; unset: 10 with Sentinel, 2 without",
    )
    redis_wait_replicas: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="Replicas that must hold what a request writes before it is answered "
        "(WAIT); unset: 1 with Sentinel, 0 without",
    )
    redis_wait_timeout: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="Seconds a write waits for its replicas (after a failover, until Sentinel has "
        "pointed a replica at the new master and it has caught up), then 503",
    )
    shutdown_drain_delay: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description="Seconds between SIGTERM (from which /ready answers 503) and closing the "
        "listener, for a balancer to stop sending",
    )
    shutdown_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds in-flight requests and conversation starts get to finish at SIGTERM",
    )
    # The sandbox proxy (docs/deployment.md#the-sandbox-proxy).
    proxy_url: str | None = Field(
        default=None,
        description="The URL clients reach this control plane at (its balancer's, e.g. "
        "https://acs.example.com): sandbox links point at its proxy",
    )
    sandbox_urls: Literal["auto", "direct", "proxy"] = Field(
        default="auto",
        description="Where exposed_urls and conversation_url point: direct (the published host "
        "port), proxy (ACS_PROXY_URL/sandboxes/{id}/proxy/…); auto: proxy when ACS_PROXY_URL is "
        "set",
    )
    proxy_max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        le=16 * 1024**3,
        description="Largest request body (and WebSocket message) the proxy forwards; 413 above",
    )
    proxy_read_timeout: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="Seconds the proxy waits for a sandbox's answer to begin, and between two "
        "of its chunks (504 when nothing came at all)",
    )

    @field_validator("lifecycle_webhook_urls", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    @field_validator("lifecycle_webhook_urls")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value

    @field_validator("enable_specs", mode="before")
    @classmethod
    def _spec_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()]
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origin_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [o.strip() for o in value.split(",") if o.strip()]
        return value

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

    @field_validator("warm_pool", mode="before")
    @classmethod
    def _pool_sizes(cls, value: Any) -> Any:
        if not isinstance(value, str | int):
            return value
        text = str(value).strip()
        if "=" not in text:
            return {"*": text}
        sizes: dict[str, str] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
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

    @field_validator("sandbox_host_ports", mode="before")
    @classmethod
    def _ports(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("sandbox_host_ports")
    @classmethod
    def _port_range(cls, value: list[int]) -> list[int]:
        for port in value:
            if not 1 <= port <= 65535:
                raise ValueError(f"{port} is not a TCP port")
        return sorted(set(value))

    @field_validator("sandbox_subnet_pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 network: {exc}") from None
        if network.prefixlen > 24:
            raise ValueError("the pool must be a /24 or larger")
        return str(network)

    @field_validator("sandbox_subnet_size")
    @classmethod
    def _fits_pool(cls, value: int, info: ValidationInfo) -> int:
        pool = info.data.get("sandbox_subnet_pool")
        if pool and value < ipaddress.IPv4Network(pool).prefixlen:
            raise ValueError(f"/{value} networks do not fit in ACS_SANDBOX_SUBNET_POOL {pool}")
        return value

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _sentinel_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()]
        return value

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

    @field_validator("llm_models", mode="before")
    @classmethod
    def _model_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [m.strip() for m in value.split(",") if m.strip()]
        return value

    @field_validator("llm_prices", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        return value


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in ServiceConfig.model_fields:
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
        field = str(first["loc"][0]) if first["loc"] else "?"
        raise ConfigError(f"{ENV_PREFIX}{field.upper()}: {first['msg']}") from None
