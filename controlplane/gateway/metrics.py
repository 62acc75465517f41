"""The gateway's Prometheus metrics, in the application's registry (controlplane/metrics.py)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from controlplane.gateway.metering import Usage

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.requests = Counter(
            "acs_llm_requests",
            "LLM gateway calls by provider and the status answered",
            ["provider", "status"],
            registry=registry,
        )
        self.tokens = Counter(
            "acs_llm_tokens",
            "Tokens metered by the LLM gateway (as the provider reported, else estimated)",
            ["provider", "kind"],
            registry=registry,
        )
        self.cost = Counter(
            "acs_llm_cost_usd",
            "Cost metered by the LLM gateway, in USD",
            ["provider"],
            registry=registry,
        )
        self.latency = Histogram(
            "acs_llm_request_seconds",
            "LLM gateway calls, from admission to the end of the answer",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "acs_llm_upstream_errors",
            "Failed upstream attempts (each retry counts) by provider and kind",
            ["provider", "code"],
            registry=registry,
        )
        self.refused = Counter(
            "acs_llm_refused",
            "Calls refused before forwarding: rate_limit, task_budget, user_budget, org_budget, "
            "member_budget",
            ["reason"],
            registry=registry,
        )
        self.unpriced = Counter(
            "acs_llm_unpriced_calls",
            "Calls of a model without a price (ACS_LLM_PRICES): metered at cost 0",
            ["provider"],
            registry=registry,
        )
        self.estimated = Counter(
            "acs_llm_estimated_usage_calls",
            "Calls whose provider reported no usage: tokens estimated from the text",
            ["provider"],
            registry=registry,
        )

    def observe(
        self, *, provider: str, status: int, seconds: float, usage: Usage, errors: list[str]
    ) -> None:
        self._child(self.requests, provider, str(status)).inc()
        self._child(self.latency, provider).observe(seconds)
        for code in errors:
            self._child(self.errors, provider, code).inc()
        if status < 400 or status == 499:
            self._child(self.tokens, provider, "prompt").inc(usage.prompt_tokens)
            self._child(self.tokens, provider, "completion").inc(usage.completion_tokens)
            self._child(self.cost, provider).inc(usage.cost)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: prometheus_client's lookup takes a lock and
        builds tuples on every call, on the path of every model call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child
