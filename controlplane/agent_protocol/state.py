"""What the control plane keeps from an agent server's events and ConversationInfo: the execution
status and the cost (docs/agent-protocol.md). Any server speaking the OpenHands agent-server
protocol (1.58) reports both the same way: ``ConversationStateUpdateEvent`` with key
``execution_status``, ``stats`` or ``full_state``, and ``stats`` (the SDK's
``ConversationStats``) in ``ConversationInfo``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controlplane.agent_protocol.models import ExecutionStatus, MetricsSnapshot, TokenUsage
from controlplane.errors import InvalidInput

STATUSES = frozenset(s.value for s in ExecutionStatus)
_SUMMED = ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens")


def status_in(value: Any) -> ExecutionStatus | None:
    return ExecutionStatus(value) if isinstance(value, str) and value in STATUSES else None


def metrics_of_stats(stats: Any) -> MetricsSnapshot | None:
    """All LLM usages of a ``ConversationStats`` combined into one snapshot; None if unreadable."""
    usages = stats.get("usage_to_metrics") if isinstance(stats, dict) else None
    if not isinstance(usages, dict):
        return None
    snapshots = [u for u in usages.values() if isinstance(u, dict)]
    if not snapshots:
        return MetricsSnapshot()
    tokens = [t for u in snapshots if isinstance(t := u.get("accumulated_token_usage"), dict)]
    usage = None
    if tokens:
        usage = TokenUsage(
            model=str(tokens[0].get("model") or ""),
            **{k: sum(int(t.get(k) or 0) for t in tokens) for k in _SUMMED},
            reasoning_tokens=sum(int(t.get("reasoning_tokens") or 0) for t in tokens),
            context_window=max(int(t.get("context_window") or 0) for t in tokens),
            per_turn_token=int(tokens[-1].get("per_turn_token") or 0),
            response_id=str(tokens[-1].get("response_id") or ""),
        )
    budgets = [b for u in snapshots if isinstance(b := u.get("max_budget_per_task"), int | float)]
    return MetricsSnapshot(
        model_name=str(snapshots[0].get("model_name") or "default"),
        accumulated_cost=sum(float(u.get("accumulated_cost") or 0.0) for u in snapshots),
        max_budget_per_task=budgets[0] if budgets else None,
        accumulated_token_usage=usage,
    )


def readable_metrics(info: dict[str, Any]) -> MetricsSnapshot | None:
    """metrics_of_info, with numbers that are not numbers a 422 (not a 500)."""
    try:
        return metrics_of_info(info)
    except (ValueError, TypeError, OverflowError):  # pydantic's ValidationError is a ValueError
        raise InvalidInput(
            "stats or metrics hold a value that is not a number where one is expected",
            ["body", "stats" if "stats" in info else "metrics"],
        ) from None


def readable_state(
    events: Iterable[dict[str, Any]],
) -> tuple[ExecutionStatus | None, MetricsSnapshot | None]:
    """latest_state, with stats that are not numbers a 422 (not a 500)."""
    try:
        return latest_state(events)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(
            "a stats update holds a value that is not a number where one is expected",
            ["body", "value"],
        ) from None


def metrics_of_info(info: dict[str, Any]) -> MetricsSnapshot | None:
    """From ``stats``; from ``metrics`` (the older shape) when there are no stats."""
    found = metrics_of_stats(info.get("stats"))
    if found is not None:
        return found
    metrics = info.get("metrics")
    if isinstance(metrics, dict):
        return MetricsSnapshot.model_validate(
            {k: v for k, v in metrics.items() if k in MetricsSnapshot.model_fields}
        )
    return None


def latest_state(
    events: Iterable[dict[str, Any]],
) -> tuple[ExecutionStatus | None, MetricsSnapshot | None]:
    """The last status and the last stats among a batch's state updates."""
    status: ExecutionStatus | None = None
    metrics: MetricsSnapshot | None = None
    for event in events:
        if event.get("kind") != "ConversationStateUpdateEvent":
            continue
        key, value = event.get("key"), event.get("value")
        if key == "execution_status":
            status = status_in(value) or status
        elif key == "stats":
            metrics = metrics_of_stats(value) or metrics
        elif key == "full_state" and isinstance(value, dict):
            status = status_in(value.get("execution_status")) or status
            metrics = metrics_of_info(value) or metrics
    return status, metrics
