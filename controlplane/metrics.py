"""Prometheus metrics, served at GET /metrics (docs/operations.md, "Metrics").

Each application owns a `Metrics` with its own CollectorRegistry (never the module-level default
registry), so several apps in one process (the tests) never clash. Request and operation metrics
are updated as things happen, through hooks handed to the code that measures them; the sandbox,
conversation and pool gauges are computed from Redis at scrape time (controlplane/gauges.py), so
every replica reports the same totals.

Under ACS_WORKERS (controlplane/workers.py) a scrape reaches one worker of several on the same
port: their metrics then live in prometheus_client's multiprocess files (PROMETHEUS_MULTIPROC_DIR,
set by the supervisor) and any worker's /metrics answers for all: counters and histograms summed
over the workers (those of a worker that died included, so they never go back), the gauges read
from Redis by the worker answering (a collector, not stored: the same in both modes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format that `generate_latest` writes."""

NO_STATUS = "unknown"
"""`execution_status` label of conversations whose agent has not reported a status yet."""

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""Set by the ACS_WORKERS supervisor (controlplane/workers.py) for its workers only."""

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_OPERATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _PoolCounters:
    """acs_pool_claims, acs_pool_misses and acs_pool_share_misses per spec, as counted in Redis
    by every replica."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(self.values)

    @staticmethod
    def _families(values: dict[str, int]) -> list[Metric]:
        claims = CounterMetricFamily(
            "acs_pool_claims", "Creates served by a warm pool member", labels=["spec"]
        )
        misses = CounterMetricFamily(
            "acs_pool_misses",
            "Creates of a spec with a warm pool that found it empty (started cold)",
            labels=["spec"],
        )
        shares = CounterMetricFamily(
            "acs_pool_share_misses",
            "Creates whose organization had used its warm_pool_share this window (started cold)",
            labels=["spec"],
        )
        families = {"claims": claims, "misses": misses, "share_misses": shares}
        for name, value in sorted(values.items()):
            kind, _, spec = name.partition(":")
            if kind in families:
                families[kind].add_metric([spec], value)
        return [claims, misses, shares]


@dataclass(eq=False)  # a registry keeps its collectors by identity (hashed)
class RedisGauges:
    """The gauges read from Redis at every scrape (controlplane/gauges.py): every replica, and
    every worker, reports the same figures; a series gone from Redis is gone from here."""

    sandboxes: dict[str, int] = field(default_factory=dict)  # by status
    conversations: dict[str, int] = field(default_factory=dict)  # by execution status
    pool_members: dict[tuple[str, str], int] = field(default_factory=dict)  # (spec, status)
    webhook_pending: int = 0

    def describe(self) -> Iterable[Metric]:
        return RedisGauges().collect()

    def collect(self) -> Iterable[Metric]:
        sandboxes = GaugeMetricFamily(
            "acs_sandboxes", "Sandbox records by status (all users)", labels=["status"]
        )
        for status, count in self.sandboxes.items():
            sandboxes.add_metric([status], count)
        conversations = GaugeMetricFamily(
            "acs_conversations",
            "Conversations by the execution status their agent last reported",
            labels=["execution_status"],
        )
        for status, count in self.conversations.items():
            conversations.add_metric([status], count)
        members = GaugeMetricFamily(
            "acs_pool_members",
            "Unclaimed warm pool members by spec and status; status=ready counts the claimable",
            labels=["spec", "status"],
        )
        for (spec, status), count in sorted(self.pool_members.items()):
            members.add_metric([spec, status], count)
        pending = GaugeMetricFamily(
            "acs_lifecycle_webhooks_pending",
            "Lifecycle webhook deliveries not yet made (outbox entries, every URL, all replicas)",
            value=self.webhook_pending,
        )
        return [sandboxes, conversations, members, pending]


class Metrics:
    """Every metric the control plane exports, registered in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self._runtime_counters: dict[str, Counter] = {}
        self.http_requests = Counter(
            "acs_http_requests",
            "HTTP requests by method, route template and status",
            ("method", "route", "status"),
            registry=reg,
        )
        self.http_duration = Histogram(
            "acs_http_request_duration_seconds",
            "HTTP request handling time by method and route template",
            ("method", "route"),
            registry=reg,
        )
        self.sandbox_api = Histogram(
            "acs_sandbox_api_seconds",
            "Duration of successful sandbox API calls (start returns once the sandbox is"
            " STARTING, not RUNNING)",
            ("operation",),
            buckets=_OPERATION_BUCKETS,
            registry=reg,
        )
        self.event_lag = Histogram(
            "acs_event_lag_seconds",
            "Time from an agent event's timestamp to its webhook delivery being stored",
            buckets=_LAG_BUCKETS,
            registry=reg,
        )
        self.from_redis = RedisGauges()
        reg.register(self.from_redis)
        self.reconcile_fixes = Counter(
            "acs_reconcile_fixes",
            "Sandbox records the reconciler changed to match the runtime (this process; under "
            "ACS_WORKERS, all of them)",
            registry=reg,
        )
        self.pool_events = _PoolCounters()
        reg.register(self.pool_events)
        self.webhook_delivered = Counter(
            "acs_lifecycle_webhooks_delivered",
            "Lifecycle webhook deliveries a receiver accepted (this process)",
            registry=reg,
        )
        self.webhook_retried = Counter(
            "acs_lifecycle_webhooks_retried",
            "Lifecycle webhook attempts that failed and will be retried (this process)",
            registry=reg,
        )
        self.webhook_dead_lettered = Counter(
            "acs_lifecycle_webhooks_dead_lettered",
            "Lifecycle webhook deliveries given up after ACS_LIFECYCLE_WEBHOOK_DEAD_AFTER"
            " (this process)",
            registry=reg,
        )
        self.store_busy = Counter(
            "acs_redis_pool_busy",
            "Requests answered 503 store_busy: every Redis connection of this process stayed in"
            " use for ACS_REDIS_POOL_TIMEOUT (a burst; not Redis being down)",
            registry=reg,
        )

    # -- hooks handed to code that must not import this module -----------------------------

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in _METHODS else "other"
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_duration.labels(method, route).observe(seconds)

    def runtime_counter(self, name: str, documentation: str, label: str) -> Callable[[str], None]:
        """A counter the sandbox runtime declares (drivers/runtime.py: RuntimeHost.counters;
        e.g. `acs_docker_errors{operation}`), made at its first request: its hook."""
        counter = self._runtime_counters.get(name)
        if counter is None:
            counter = Counter(name, documentation, (label,), registry=self.registry)
            self._runtime_counters[name] = counter
        return lambda value: counter.labels(value).inc()

    def sandbox_call(self, operation: str, seconds: float) -> None:
        """A successful call of the sandbox API (start, pause, resume, delete)."""
        self.sandbox_api.labels(operation).observe(seconds)

    def reconcile_fixed(self) -> None:
        self.reconcile_fixes.inc()

    def event_delivered(self, seconds: float) -> None:
        self.event_lag.observe(max(seconds, 0.0))  # a sandbox clock ahead of ours reads 0

    def render(self) -> bytes:
        shared = os.environ.get(MULTIPROCESS_DIR)
        if not shared:
            return generate_latest(self.registry)
        # Every worker's counters and histograms from their files; what Redis holds (the
        # gauges, the pool's counters) as this worker read it (the same for all).
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=shared)  # type: ignore[no-untyped-call]
        registry.register(self.from_redis)
        registry.register(self.pool_events)
        return generate_latest(registry)
