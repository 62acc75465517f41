"""A burst of cold starts past what a replica boots at once: the bound's starts boot, the next
ones wait their turn (STARTING, no container yet) and all reach RUNNING; past the queue a create
answers 503 with Retry-After at once and leaves nothing behind (issue 30)."""

from __future__ import annotations

import asyncio
from typing import Any

from controlplane import keys
from tests.support.sandbox_helpers import OwnDocker, wait_status
from tests.support.types import Client, ClientFactory, UserHeaders

SLOTS, QUEUE, BURST = 2, 3, 8


async def post_start(client: Client, headers: dict[str, str]) -> tuple[int, Any, Any]:
    resp = await client.post("/api/v1/sandboxes", json={}, headers=headers)
    return resp.status, await resp.json(), resp.headers


async def statuses(client: Client, headers: dict[str, str]) -> dict[str, str]:
    resp = await client.get("/api/v1/sandboxes/search", headers=headers)
    assert resp.status == 200
    return {item["id"]: item["status"] for item in (await resp.json())["items"]}


async def test_a_burst_past_the_queue_waits_or_is_refused_at_once(
    sbx_factory: ClientFactory, user_headers: UserHeaders, own_docker: OwnDocker
) -> None:
    sbx = await sbx_factory(
        max_concurrent_starts=SLOTS, max_queued_starts=QUEUE, max_running_per_user=0
    )
    alice = await user_headers("alice")

    answers = await asyncio.gather(*(post_start(sbx, alice) for _ in range(BURST)))

    admitted = [body for status, body, _ in answers if status == 200]
    refused = [(body, headers) for status, body, headers in answers if status != 200]
    assert len(admitted) == SLOTS + QUEUE, answers
    assert all(body["status"] == "STARTING" for body in admitted)
    assert len(refused) == BURST - SLOTS - QUEUE
    for body, headers in refused:
        assert set(body) == {"detail"}, body
        assert "ACS_MAX_QUEUED_STARTS" in body["detail"]
        assert int(headers["Retry-After"]) >= 1
    statuses_503 = {status for status, _, _ in answers if status != 200}
    assert statuses_503 == {503}

    # Nothing of the refused ones: no record, no container; and while the admitted ones come
    # up, never more than SLOTS of them boot at once (a waiting start has no container yet).
    ids = {body["id"] for body in admitted}
    most_booting = 0
    for _ in range(600):
        seen = await statuses(sbx, alice)
        assert set(seen) == ids
        assert "ERROR" not in seen.values(), seen
        running = sum(1 for s in seen.values() if s == "RUNNING")
        booting = len(own_docker.containers()) - running
        most_booting = max(most_booting, booting)
        assert booting <= SLOTS, (booting, seen)
        if running == len(ids):
            break
        await asyncio.sleep(0.05)
    for sandbox_id in ids:  # none failed by a time-out: each is RUNNING
        await wait_status(sbx, alice, sandbox_id, "RUNNING", within=1)
    assert most_booting >= 1
    assert len(own_docker.containers()) == len(ids)
    gate = sbx.app[keys.SANDBOXES].launcher.gate
    assert (gate.booting, gate.waiting) == (0, 0)

    # Every place was given back: as many as before are admitted again (and given back).
    for ticket in gate.admit(SLOTS + QUEUE):
        ticket.release()
