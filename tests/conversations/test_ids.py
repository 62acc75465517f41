"""A conversation id in every form clients send (32 hex digits as our API writes it, dashed as
the SDK and the official agent server write it, either in upper case) on every control-plane
route that takes one, and on the events WebSocket."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from controlplane.conversations.titles import title_of
from tests.support.conversation_helpers import (
    UserFactory,
    message,
    start_and_wait,
    status_is,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish

pytestmark = pytest.mark.usefixtures("sandbox_images")


async def test_every_route_takes_every_form(user: UserFactory, fake_llm: FakeLLM) -> None:
    fake_llm.script([reply_finish(), reply_finish()])
    alice = await user("alice")
    task = await start_and_wait(alice, initial_message=message("hi"))
    plain = task["app_conversation_id"]
    await wait_finished(alice, plain)
    dashed = str(uuid.UUID(plain))
    for cid in (plain, dashed, plain.upper(), dashed.upper()):
        reads: list[tuple[str, Callable[[Any], bool]]] = [
            (f"/api/v1/app-conversations/{cid}", lambda b: b["id"] == plain),
            (f"/api/v1/app-conversations?ids={cid}", lambda b: b[0]["id"] == plain),
            (f"/api/v1/conversation/{cid}/events/search", lambda b: len(b["items"]) > 3),
            (f"/api/v1/events/search?conversation_id__eq={cid}", lambda b: len(b["items"]) > 3),
            (f"/api/v1/events/count?conversation_id__eq={cid}", lambda b: b > 3),
            (f"/api/conversations/{cid}", lambda b: b["conversation_id"] == plain),
            (f"/api/conversations/{cid}/config", lambda b: b["session_id"] == plain),
            (f"/api/v1/conversations/{cid}/pending-messages", lambda b: b == []),
            (f"/api/v1/app-conversations/{cid}/git/changes?path=/workspace", lambda b: b == []),
        ]
        for path, expected in reads:
            status, body = await alice.call("GET", path)
            assert status == 200, (path, body)
            assert expected(body), (path, body)
        renamed = await alice.ok("PATCH", f"/api/v1/app-conversations/{cid}", json={"title": cid})
        assert renamed["id"] == plain
        async with alice.http.ws_connect(
            f"{alice.base}/api/v1/events/socket?conversation_id={cid}", headers=alice.headers
        ) as ws:
            assert (await ws.receive_json(timeout=10))["kind"]
    await alice.ok("POST", f"/api/v1/app-conversations/{dashed.upper()}/events", json=message("2"))
    await wait_events(alice, plain, lambda evs: "'2'" in str(evs) and status_is("finished")(evs))


async def test_a_conversation_is_titled_from_its_first_message(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish(), reply_finish(), reply_finish()])
    alice = await user("alice")
    long = "Fix the flaky login test\nit fails on CI " + "x" * 80
    task = await start_and_wait(alice, initial_message=message(long))
    cid = task["app_conversation_id"]
    await wait_finished(alice, cid)
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert conversation["title"] == "Fix the flaky login test"
    # Later messages do not rename it; nor does the first one a title the caller chose.
    await alice.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("other"))
    await wait_events(alice, cid, lambda evs: "other" in str(evs) and status_is("finished")(evs))
    assert (await alice.ok("GET", f"/api/v1/app-conversations/{cid}"))["title"] == long[:24]
    named = await start_and_wait(alice, initial_message=message("text"), title="Mine")
    await wait_finished(alice, named["app_conversation_id"])
    mine = await alice.ok("GET", f"/api/v1/app-conversations/{named['app_conversation_id']}")
    assert mine["title"] == "Mine"
    # A long first line is cut at 50 characters.
    assert len(title_of("y" * 200)) == 50
