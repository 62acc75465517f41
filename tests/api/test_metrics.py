"""GET /metrics: access, the Prometheus text format, and every metric moving for a real cause."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import docker
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from controlplane import keys
from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from tests.support.docker_fixtures import run_prefix
from tests.support.records import NO_ENGINE, sandbox_record
from tests.support.types import Client, ClientFactory, UserHeaders

# Nothing listens there: refused at once. (A missing unix socket works too, but the docker SDK
# leaks the socket it failed to connect, which the warning filter turns into a test error.)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: Client, headers: dict[str, str]) -> Samples:
    response = await client.get("/metrics", headers=headers)
    assert response.status == 200, await response.text()
    assert response.content_type == "text/plain"
    out: Samples = {}
    for family in text_string_to_metric_families(await response.text()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _labels), v in samples.items() if n == name)


async def test_metrics_need_an_admin_key(
    make_client: ClientFactory, admin_headers: dict[str, str], user_headers: UserHeaders
) -> None:
    client = await make_client()
    response = await client.get("/metrics")
    assert response.status == 401
    assert "detail" in await response.json()
    response = await client.get("/metrics", headers={"X-Session-API-Key": "acs_nope_nope"})
    assert response.status == 401
    response = await client.get("/metrics", headers=await user_headers("alice"))
    assert response.status == 403
    assert response.content_type == "application/json"
    assert (await response.json())["detail"] == "metrics need an admin API key"
    admin = await user_headers("root", admin=True)
    bearer = {"Authorization": f"Bearer {admin['X-Session-API-Key']}"}
    for headers in (admin_headers, admin, bearer):
        samples = await scrape(client, headers)
        assert ("acs_reconcile_fixes_total", frozenset()) in samples


async def test_metrics_public_when_configured(make_client: ClientFactory) -> None:
    client = await make_client(metrics_public=True)
    samples = await scrape(client, {})
    assert value(samples, "acs_sandboxes", status="RUNNING") == 0


async def test_request_counters_and_durations_by_route_template(
    make_client: ClientFactory, admin_headers: dict[str, str]
) -> None:
    client = await make_client()
    for _ in range(3):
        assert (await client.get("/api/settings", headers=admin_headers)).status == 200
    assert (await client.get("/api/settings")).status == 401
    for name in ("one", "two"):  # two paths, one route template: one series
        response = await client.delete(f"/api/secrets/{name}", headers=admin_headers)
        assert response.status == 404
    for path in ("/nowhere", "/nowhere/else", f"/x{secrets.token_hex(4)}"):
        assert (await client.get(path)).status == 404

    samples = await scrape(client, admin_headers)
    name = "acs_http_requests_total"
    assert value(samples, name, method="GET", route="/api/settings", status="200") == 3
    assert value(samples, name, method="GET", route="/api/settings", status="401") == 1
    assert value(samples, name, method="DELETE", route="/api/secrets/{name}", status="404") == 2
    assert value(samples, name, method="GET", route="<unmatched>", status="404") == 3
    routes = {dict(labels)["route"] for (n, labels) in samples if n == name}
    assert not any(r.startswith(("/nowhere", "/x")) for r in routes), routes
    duration = "acs_http_request_duration_seconds"
    assert value(samples, f"{duration}_count", method="GET", route="/api/settings") == 4
    assert value(samples, f"{duration}_sum", method="GET", route="/api/settings") > 0
    # The scrape itself is counted once it has finished.
    again = await scrape(client, admin_headers)
    assert value(again, name, method="GET", route="/metrics", status="200") == 1


async def test_two_apps_in_one_process_keep_their_own_registries(
    make_client: ClientFactory, admin_headers: dict[str, str]
) -> None:
    first = await make_client()
    second = await make_client()
    assert first.app[keys.METRICS].registry is not second.app[keys.METRICS].registry
    for _ in range(2):
        await first.get("/health")
    await second.get("/health")
    route = {"method": "GET", "route": "/health", "status": "200"}
    assert value(await scrape(first, admin_headers), "acs_http_requests_total", **route) == 2
    assert value(await scrape(second, admin_headers), "acs_http_requests_total", **route) == 1


async def test_sandbox_and_conversation_gauges_count_redis_records(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    client = await make_client()
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    wanted = {
        SandboxStatus.RUNNING: 3,
        SandboxStatus.PAUSED: 2,
        SandboxStatus.ERROR: 1,
    }
    records = []
    for status, count in wanted.items():
        for i in range(count):
            record = sandbox_record(f"user{i}", status)
            assert await store.create(record, 0, Limits()) == "ok"
            records.append(record)
    conversations = ConversationStore(raw_redis)
    running, finished = ExecutionStatus.RUNNING, ExecutionStatus.FINISHED
    for execution in (running, running, finished, None):
        await conversations.save(
            AppConversationInfo(
                id=secrets.token_hex(16),
                created_by_user_id="user0",
                sandbox_id=records[0].id,
                execution_status=execution,
            )
        )

    samples = await scrape(client, admin_headers)
    for status in SandboxStatus:
        assert value(samples, "acs_sandboxes", status=status.value) == wanted.get(status, 0)
    assert value(samples, "acs_conversations", execution_status="running") == 2
    assert value(samples, "acs_conversations", execution_status="finished") == 1
    assert value(samples, "acs_conversations", execution_status="unknown") == 1
    assert value(samples, "acs_conversations", execution_status="error") == 0

    # Computed at scrape time: a deleted record is gone from the next scrape.
    await store.delete(records[0])
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_sandboxes", status="RUNNING") == 2


async def test_sandbox_gauge_pages_through_more_than_one_page(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    client = await make_client()
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    for i in range(1203):  # 500-record pages: two full ones and a partial one
        record = sandbox_record("bulk", SandboxStatus.PAUSED)
        record = record.model_copy(update={"id": f"{i:012x}{secrets.token_hex(5)}"})
        assert await store.create(record, 0, Limits()) == "ok"
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_sandboxes", status="PAUSED") == 1203


async def test_docker_errors_are_counted_when_the_engine_is_unreachable(
    make_client: ClientFactory, admin_headers: dict[str, str]
) -> None:
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    before = await scrape(client, admin_headers)
    response = await client.post("/api/v1/sandboxes", headers=admin_headers)
    assert response.status == 503
    assert "detail" in await response.json()
    after = await scrape(client, admin_headers)
    name = "acs_docker_errors_total"
    assert value(after, name, operation="image_exists") == (
        value(before, name, operation="image_exists") + 1
    )
    # The API call failed, so it is not in the successful-call latency histogram.
    assert value(after, "acs_sandbox_api_seconds_count", operation="start") == 0
    # /ready pings the engine: another counted failure.
    assert (await client.get("/ready")).status == 503
    again = await scrape(client, admin_headers)
    assert value(again, name, operation="ping") >= value(after, name, operation="ping") + 1


async def test_event_lag_is_observed_for_webhook_events(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    key = secrets.token_urlsafe(32)
    record = sandbox_record("alice", SandboxStatus.RUNNING, key)
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    assert await store.create(record, 0, Limits()) == "ok"
    conversation_id = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=conversation_id, created_by_user_id="alice", sandbox_id=record.id)
    )
    now = datetime.now(UTC)
    batch: list[dict[str, Any]] = [
        {
            "id": "ev-aware",
            "kind": "MessageEvent",
            "source": "agent",
            "timestamp": (now - timedelta(seconds=3)).isoformat(),
        },
        {  # no offset: read as UTC
            "id": "ev-naive",
            "kind": "MessageEvent",
            "source": "agent",
            "timestamp": (now - timedelta(seconds=7)).replace(tzinfo=None).isoformat(),
        },
    ]
    url = f"/api/v1/webhooks/{record.id}/events/{conversation_id}"
    # A wrong key is refused and observes nothing.
    bad = await client.post(url, json=batch, headers={"X-Session-API-Key": "wrong"})
    assert bad.status == 401
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_event_lag_seconds_count") == 0

    response = await client.post(url, json=batch, headers={"X-Session-API-Key": key})
    assert response.status == 200, await response.text()
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_event_lag_seconds_count") == 2
    lag = value(samples, "acs_event_lag_seconds_sum")
    assert 10 <= lag < 20, lag
    assert value(samples, "acs_event_lag_seconds_bucket", le="5.0") == 1
    assert value(samples, "acs_event_lag_seconds_bucket", le="10.0") == 2


async def test_reconcile_fixes_are_exported(
    make_client: ClientFactory,
    admin_headers: dict[str, str],
    raw_redis: aioredis.Redis,
    docker_client: docker.DockerClient,
) -> None:
    """Real drift: a RUNNING record whose container does not exist becomes MISSING."""
    prefix = f"{run_prefix()}metrics-{secrets.token_hex(3)}-"
    client = await make_client(with_sandboxes=True, container_prefix=prefix)
    reconciler = client.app[keys.RECONCILER]
    await reconciler.sweep()  # whatever the first sweep found is not ours to count
    before = value(await scrape(client, admin_headers), "acs_reconcile_fixes_total")
    record = sandbox_record("alice", SandboxStatus.RUNNING)
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    assert await store.create(record, 0, Limits()) == "ok"
    assert await reconciler.sweep() == 1
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_reconcile_fixes_total") == before + 1
    assert value(samples, "acs_sandboxes", status="MISSING") == 1
    assert value(samples, "acs_sandboxes", status="RUNNING") == 0


@pytest.mark.parametrize("operation", ["pause", "resume", "delete"])
async def test_failed_sandbox_calls_are_not_timed(
    make_client: ClientFactory, admin_headers: dict[str, str], operation: str
) -> None:
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    sandbox_id = naming.new_sandbox_id()
    if operation == "delete":
        response = await client.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=admin_headers)
    else:
        path = f"/api/v1/sandboxes/{sandbox_id}/{operation}"
        response = await client.post(path, headers=admin_headers)
    assert response.status == 404
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_sandbox_api_seconds_count", operation=operation) == 0


async def test_successful_sandbox_calls_are_timed_per_operation(
    make_client: ClientFactory, admin_headers: dict[str, str], raw_redis: aioredis.Redis
) -> None:
    """Pausing a PAUSED sandbox and resuming a RUNNING one succeed without the engine."""
    client = await make_client(with_sandboxes=True, docker_url=NO_ENGINE)
    store = SandboxStore(raw_redis, client.app[keys.SECRET_BOX])
    paused = sandbox_record("admin", SandboxStatus.PAUSED)
    running = sandbox_record("admin", SandboxStatus.RUNNING)
    for record in (paused, running):
        assert await store.create(record, 0, Limits()) == "ok"
    for _ in range(2):
        response = await client.post(f"/api/v1/sandboxes/{paused.id}/pause", headers=admin_headers)
        assert response.status == 200, await response.text()
    response = await client.post(f"/api/v1/sandboxes/{running.id}/resume", headers=admin_headers)
    assert response.status == 200, await response.text()
    samples = await scrape(client, admin_headers)
    assert value(samples, "acs_sandbox_api_seconds_count", operation="pause") == 2
    assert value(samples, "acs_sandbox_api_seconds_count", operation="resume") == 1
    assert value(samples, "acs_sandbox_api_seconds_count", operation="delete") == 0
    assert value(samples, "acs_sandbox_api_seconds_bucket", operation="pause", le="+Inf") == 2
