"""The sandbox webhooks: events as a JSON array (as agent servers post them) or one event,
stored as sent; status and cost taken from state updates and ConversationInfo ``stats``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.records import RecordedSandbox, event, stats
from tests.support.types import Client


async def search(client: Client, headers: dict[str, str], cid: str, **query: str) -> list[Any]:
    params = {"conversation_id__eq": cid, **query}
    resp = await client.get("/api/v1/events/search", params=params, headers=headers)
    assert resp.status == 200, await resp.text()
    items: list[Any] = (await resp.json())["items"]
    return items


async def test_single_events_and_arrays_are_stored_as_sent(recorded: RecordedSandbox) -> None:
    client, sandbox_id, cid, sandbox, alice = recorded
    url = f"/api/v1/webhooks/{sandbox_id}/events/{cid}"
    one = event(llm_message={"role": "user", "content": [{"type": "text", "text": "hi"}]})
    resp = await client.post(url, json=one, headers=sandbox)
    assert resp.status == 200, await resp.text()
    batch = [event("ActionEvent", thought=[], extra={"nested": [1, 2]}), event("PauseEvent")]
    resp = await client.post(url, json=batch, headers=sandbox)
    assert resp.status == 200
    resp = await client.post(url, json=batch, headers=sandbox)  # a retried batch: no duplicates
    assert resp.status == 200
    assert await search(client, alice, cid) == [one, *batch]

    # The dashed conversation id works as well (official servers post the hex form).
    dashed = f"{cid[:8]}-{cid[8:12]}-{cid[12:16]}-{cid[16:20]}-{cid[20:]}"
    resp = await client.post(
        f"/api/v1/webhooks/{sandbox_id}/events/{dashed}", json=event(), headers=sandbox
    )
    assert resp.status == 200


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (
            {"kind": "MessageEvent", "source": "agent", "timestamp": "2026-01-01T00:00:00"},
            ["body", "id"],
        ),
        (
            [
                {"id": "a", "kind": "X", "source": "agent", "timestamp": "2026-01-01T00:00:00"},
                {"id": "b"},
            ],
            ["body", "1", "kind"],
        ),
        (
            [{"id": "a", "kind": "X", "source": "agent", "timestamp": "yesterday"}],
            ["body", "0", "timestamp"],
        ),
        ("not an event", ["body"]),
    ],
)
async def test_bad_events_are_422(recorded: RecordedSandbox, body: Any, loc: list[str]) -> None:
    client, sandbox_id, cid, sandbox, _ = recorded
    resp = await client.post(
        f"/api/v1/webhooks/{sandbox_id}/events/{cid}", json=body, headers=sandbox
    )
    assert resp.status == 422
    assert (await resp.json())["detail"][0]["loc"] == loc


async def test_malformed_and_empty_bodies_are_422(recorded: RecordedSandbox) -> None:
    client, sandbox_id, cid, sandbox, _ = recorded
    url = f"/api/v1/webhooks/{sandbox_id}/events/{cid}"
    for raw in (b"{not json", b"", b"[" * 100_000):
        resp = await client.post(
            url, data=raw, headers={**sandbox, "Content-Type": "application/json"}
        )
        assert resp.status == 422, raw[:10]
        assert (await resp.json())["detail"][0]["loc"] == ["body"]


async def test_status_and_cost_from_state_updates(recorded: RecordedSandbox) -> None:
    client, sandbox_id, cid, sandbox, alice = recorded
    url = f"/api/v1/webhooks/{sandbox_id}/events/{cid}"
    batch = [
        event("ConversationStateUpdateEvent", key="execution_status", value="running"),
        event("ConversationStateUpdateEvent", key="stats", value=stats(0.25, 100, 20)),
    ]
    assert (await client.post(url, json=batch, headers=sandbox)).status == 200
    conversation = await (
        await client.get(f"/api/v1/app-conversations/{cid}", headers=alice)
    ).json()
    assert conversation["execution_status"] == "running"
    assert conversation["metrics"]["accumulated_cost"] == 0.25
    assert conversation["metrics"]["max_budget_per_task"] == 5.0
    assert conversation["metrics"]["accumulated_token_usage"]["prompt_tokens"] == 100

    # A full_state snapshot (what a socket subscriber gets first) carries both as well.
    full = {"execution_status": "finished", "stats": stats(0.5, 300, 40)}
    one = event("ConversationStateUpdateEvent", key="full_state", value=full)
    assert (await client.post(url, json=one, headers=sandbox)).status == 200
    conversation = await (
        await client.get(f"/api/v1/app-conversations/{cid}", headers=alice)
    ).json()
    assert conversation["execution_status"] == "finished"
    assert conversation["metrics"]["accumulated_cost"] == 0.5


async def test_conversation_info_cost_from_stats_summed_over_usages(
    recorded: RecordedSandbox,
) -> None:
    client, sandbox_id, cid, sandbox, alice = recorded
    url = f"/api/v1/webhooks/{sandbox_id}/conversations"
    both = stats(1.0, 1000, 100)
    both["usage_to_metrics"].update(stats(0.5, 500, 50, "condenser")["usage_to_metrics"])
    info = {"id": cid, "execution_status": "idle", "stats": both, "metrics": None}
    assert (await client.post(url, json=info, headers=sandbox)).status == 200
    conversation = await (
        await client.get(f"/api/v1/app-conversations/{cid}", headers=alice)
    ).json()
    assert conversation["execution_status"] == "idle"
    metrics = conversation["metrics"]
    assert metrics["accumulated_cost"] == 1.5
    assert metrics["accumulated_token_usage"]["prompt_tokens"] == 1500
    assert metrics["accumulated_token_usage"]["completion_tokens"] == 150

    # An info without stats keeps the older ``metrics`` reading.
    older = {
        "id": cid,
        "execution_status": "paused",
        "metrics": {"model_name": "m", "accumulated_cost": 2.0},
    }
    assert (await client.post(url, json=older, headers=sandbox)).status == 200
    conversation = await (
        await client.get(f"/api/v1/app-conversations/{cid}", headers=alice)
    ).json()
    assert conversation["metrics"]["accumulated_cost"] == 2.0
    assert conversation["execution_status"] == "paused"


async def test_time_filters_on_naive_timestamps(recorded: RecordedSandbox) -> None:
    client, sandbox_id, cid, sandbox, alice = recorded
    base = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    batch = [event(when=base + timedelta(minutes=n)) for n in range(4)]
    assert (
        await client.post(
            f"/api/v1/webhooks/{sandbox_id}/events/{cid}", json=batch, headers=sandbox
        )
    ).status == 200
    found = await search(
        client,
        alice,
        cid,
        timestamp__gte="2026-03-01T12:01:00Z",
        timestamp__lt="2026-03-01T14:03:00+02:00",
    )
    assert found == batch[1:3]
    found = await search(client, alice, cid, timestamp__gte="2026-03-01T12:02:00")  # naive: UTC
    assert found == batch[2:]
    resp = await client.get(
        "/api/v1/events/count",
        params={"conversation_id__eq": cid, "timestamp__lt": "2026-03-01T12:01:00Z"},
        headers=alice,
    )
    assert await resp.json() == 1
