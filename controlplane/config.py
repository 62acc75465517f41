"""Typed service configuration, read from the environment once by the CLI.

`create_app` never reads the environment itself: it takes a `ServiceConfig`. Field `x` is read
from `ACS_X`. The fields are grouped by concern, one model per group (their docstrings title the
groups of docs/configuration.md, which config_reference.py writes from these models), and
ServiceConfig is all of them in one flat model.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from drivers.kube_names import PREFIX_PATTERN
from drivers.kube_options import PRIVATE_RANGES

ENV_PREFIX = "ACS_"
T = TypeVar("T")


class ConfigError(Exception):
    """Configuration that cannot be used; the message names the variable."""


def split_commas(value: Any) -> Any:
    """`a, b,,c` -> ["a", "b", "c"]; anything but a string is left to the field's type."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[T], BeforeValidator(split_commas)]
"""A list written in one variable as comma-separated items (each then validated as T)."""


def split_pairs(value: Any) -> Any:
    """`a=1, b=2` -> {"a": "1", "b": "2"}; anything but a string is left to the field's type."""
    if not isinstance(value, str):
        return value
    pairs: dict[str, str] = {}
    for item in split_commas(value):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        pairs[key.strip()] = val.strip()
    return pairs


KeyValues = Annotated[dict[str, str], BeforeValidator(split_pairs)]
"""A mapping written in one variable as comma-separated `key=value` items."""


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
    )
    redis_wait_replicas: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="replicas that must hold what a request writes before it is answered (Redis "
        "`WAIT` after each write; `0`: no wait)",
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

    driver: Literal["docker", "kubernetes"] = Field(
        default="docker",
        description="where sandboxes run: `docker` (the engine of `ACS_DOCKER_URL`) or "
        "`kubernetes` (pods in `ACS_KUBE_NAMESPACE`, [Kubernetes](#kubernetes) below; "
        "[deployment](deployment.md#sandboxes-on-kubernetes))",
    )
    docker_url: str | None = Field(
        default=None,
        description="Docker engine URL; unset uses `DOCKER_HOST` or the local socket",
    )
    docker_threads: int = Field(
        default=8,
        ge=1,
        le=64,
        description="threads of the slow lane for Docker calls (create and start, restart, "
        "remove, networks): bounds concurrent slow engine calls",
    )
    docker_quick_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        description="threads of the quick lane (inspect, pause, unpause, image look-up, ping, "
        "listing): these never wait behind the slow lane",
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
    publish_host: str = Field(
        default="127.0.0.1", description="host address sandbox ports are published on"
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
    """Sandbox networks and the host firewall"""

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
        description="port of the webhook listener, which `serve` binds on every sandbox "
        "network's gateway address and which answers only the webhook routes; must differ from "
        "`--port` when `--host` is `0.0.0.0` or `::`; `0`: any free port",
    )
    sandbox_subnet_pool: str = Field(
        default="10.213.0.0/16",
        description="where the sandbox networks' subnets are taken from (each overlaps no "
        "Docker network and no host route)",
    )
    sandbox_subnet_size: int = Field(
        default=22,
        ge=16,
        le=28,
        description="prefix length of each sandbox network: a /22 holds 1,021 sandboxes, the "
        "default pool 64 such networks. A /24 holds only 253, fewer than the ~345 idle sandboxes "
        "admission admits on a 24 GiB host ([operations](operations.md#capacity)); a network "
        "that exists keeps the size it was created with",
    )
    host_firewall: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="iptables rules fencing the sandbox networks: `auto` manages them when "
        "running as root with `iptables` (otherwise logs `host_firewall_unavailable` and "
        "restricted-egress specs cannot start), `on` makes that a start-up error, `off` never "
        "touches iptables ([security](security.md))",
    )
    sandbox_host_ports: CommaList[int] = Field(
        default_factory=list,
        description="comma-separated TCP ports on the host that every sandbox may reach at "
        "`host.docker.internal` (e.g. `11434` for a model server); nothing else on the host is "
        "reachable but the webhook listener. The LLM gateway may call the host's own addresses "
        "on these ports only ([llm-gateway.md](llm-gateway.md#where-the-gateway-may-connect))",
    )

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


class Kubernetes(BaseModel):
    """Kubernetes"""

    kubeconfig: Path | None = Field(
        default=None,
        description="with `ACS_DRIVER=kubernetes`: the kubeconfig file the control plane "
        "connects with; unset: the in-cluster credentials of the pod it runs in (its service "
        "account, which needs the Role of [deployment](deployment.md#rbac))",
    )
    kube_context: str | None = Field(
        default=None, description="the kubeconfig's context to use; unset: its current context"
    )
    kube_namespace: str = Field(
        default="acs-sandboxes",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="the namespace sandboxes run in (it must exist; the control plane needs "
        "nothing outside it)",
    )
    kube_endpoint: Literal["pod_ip", "service"] = Field(
        default="pod_ip",
        description="how the control plane reaches a sandbox: `pod_ip` (the pod's address: the "
        "control plane must route to the pod network) or `service` (a ClusterIP Service per "
        "sandbox, kept across pause and resume)",
    )
    kube_control_plane_url: str | None = Field(
        default=None,
        description="the control plane as sandboxes reach it (their webhooks; e.g. the "
        "ClusterIP of a Service in front of the webhook listener, `http://10.96.0.50:3001`: "
        "sandboxes of restricted egress get no DNS); unset: "
        "`http://<ACS_KUBE_WEBHOOK_ADDRESS>:<ACS_WEBHOOK_PORT>`",
    )
    kube_webhook_address: str = Field(
        default="0.0.0.0",  # noqa: S104 (in a pod: its own address, behind a Service)
        description="the address the webhook listener binds for sandboxes (in a pod, `0.0.0.0`; "
        "outside the cluster, this host's address on a network the pods reach)",
    )
    kube_control_plane_labels: KeyValues = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "acs-control-plane"},
        description="labels of the control plane's pods (`k=v,…`), which the sandboxes' "
        "NetworkPolicies admit to their ports and let them reach; used when the control plane "
        "runs in the cluster",
    )
    kube_control_plane_namespace: str | None = Field(
        default=None,
        description="the namespace of those pods; unset: the control plane's own, in a pod "
        "(Kubernetes 1.21+ labels namespaces by name, which a policy across namespaces needs)",
    )
    kube_control_plane_cidrs: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated addresses (CIDRs) a control plane outside the cluster "
        "connects from and listens on, for the NetworkPolicies; unset: "
        "`ACS_KUBE_WEBHOOK_ADDRESS/32` when that is an address",
    )
    kube_storage_class: str | None = Field(
        default=None,
        description="the StorageClass of workspace claims; unset: the cluster's default",
    )
    kube_workspace_size: str = Field(
        default="10Gi",
        pattern=r"^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$",
        description="the size each workspace claim requests",
    )
    kube_image_registry: str | None = Field(
        default=None,
        description="registry (and path) the specs' images are pulled from, e.g. "
        "`registry.example.com/acs`; an image that names its own registry is left as it is",
    )
    kube_image_pull_secrets: CommaList[str] = Field(
        default_factory=list,
        description="comma-separated Secrets (in the sandbox namespace) pods pull images with",
    )
    kube_image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        default="IfNotPresent",
        description="the pods' imagePullPolicy; `Never` for images loaded onto the nodes "
        "(then an image no node has is missing at once, when nodes may be read)",
    )
    kube_runtime_classes: KeyValues = Field(
        default_factory=dict,
        description="a spec's `runtime` -> the RuntimeClass its pods name (`runsc=gvisor,…`); "
        "a runtime not listed names a RuntimeClass of its own name",
    )
    kube_node_selector: KeyValues = Field(
        default_factory=dict,
        description="node labels sandbox pods are placed by (`k=v,…`), e.g. a pool of sandbox "
        "nodes; admission counts only those nodes",
    )
    kube_cpu_request: float = Field(
        default=0.05,
        gt=0,
        le=256,
        description="CPU cores each sandbox pod requests (its limit is the spec's `cpus`)",
    )
    kube_pause_grace: int = Field(
        default=5,
        ge=0,
        le=3600,
        description="seconds a paused sandbox's processes get between SIGTERM and SIGKILL as "
        "its pod is deleted",
    )
    kube_schedule_timeout: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="seconds a new pod may stay unschedulable before its start fails (longer "
        "with a cluster autoscaler); meanwhile new sandboxes are refused with 429",
    )
    kube_pod_start_timeout: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="seconds from a pod's creation to its container running, image pull "
        "included (then `ACS_START_TIMEOUT` for the agent server's `/health`)",
    )
    kube_internet_except: CommaList[str] = Field(
        default_factory=lambda: list(PRIVATE_RANGES),
        description="what `egress: internet` leaves out (CIDRs): by default the private and "
        "link-local ranges, where the cluster's pods, Services, nodes and API server are",
    )
    kube_dns_labels: KeyValues = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"},
        description="labels of the cluster DNS pods that sandboxes of `egress: internet` may "
        "query (port 53); empty: no DNS rule",
    )

    @field_validator("kube_control_plane_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "$(" in value:
            # Kubernetes leaves `$(VAR)` as it is when VAR is not set: in the shipped manifests,
            # the acs-webhooks Service did not exist yet when this pod was made.
            raise ValueError(
                f"{value!r} names a variable Kubernetes did not set (a Service's address: does "
                "the Service exist? The pod's restart reads it again)"
            )
        if not re.fullmatch(r"https?://[^/?#\s]+(/[^?#\s]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL without query or fragment")
        return value.rstrip("/")

    @field_validator("kube_control_plane_cidrs", "kube_internet_except")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            try:
                out.append(str(ipaddress.IPv4Network(item, strict=False)))
            except ValueError as exc:
                raise ValueError(f"{item!r} is not an IPv4 address or network: {exc}") from None
        return out

    @field_validator("kube_webhook_address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            return str(ipaddress.IPv4Address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 address") from None


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
    host_memory_floor: int = Field(
        default=512 * 1024**2,
        ge=0,
        description="bytes: new sandboxes (cold starts, pool refills) are refused with 429 "
        "while the host's `MemAvailable` minus the new reservation is below this; read from "
        "the control plane's `/proc/meminfo`, so only with a local engine (a unix socket); "
        "`0` = off",
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
    RateLimits,
    Runtime,
    Isolation,
    SandboxProxy,
    Kubernetes,
    Capacity,
    Upkeep,
    Snapshots,
    LifecycleWebhooks,
    Models,
    LlmGateway,
)
"""The groups, in the order docs/configuration.md lists them."""


class ServiceConfig(
    LlmGateway,
    Models,
    LifecycleWebhooks,
    Snapshots,
    Upkeep,
    Capacity,
    SandboxProxy,
    Kubernetes,
    Isolation,
    Runtime,
    RateLimits,
    Access,
    Server,
    Storage,
):
    """Everything the control plane needs to run: every group's fields in one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _kubernetes(self) -> ServiceConfig:
        if self.driver != "kubernetes":
            return self
        if not re.fullmatch(PREFIX_PATTERN, self.container_prefix):
            raise ValueError(
                "ACS_CONTAINER_PREFIX: with ACS_DRIVER=kubernetes it names pods, claims and "
                f"Services: lower-case letters, digits and '-', a letter first, at most 40 "
                f"characters ({self.container_prefix!r})"
            )
        if self.kube_control_plane_url is None and self.kube_webhook_address == "0.0.0.0":  # noqa: S104
            raise ValueError(
                "ACS_KUBE_CONTROL_PLANE_URL: with ACS_KUBE_WEBHOOK_ADDRESS=0.0.0.0 sandboxes need "
                "the URL they reach the control plane at (e.g. a Service in front of its webhook "
                "listener)"
            )
        return self


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
        if not first["loc"]:  # a rule across fields: its message names the variables
            raise ConfigError(str(first["msg"]).removeprefix("Value error, ")) from None
        field = str(first["loc"][0])
        raise ConfigError(f"{ENV_PREFIX}{field.upper()}: {first['msg']}") from None
