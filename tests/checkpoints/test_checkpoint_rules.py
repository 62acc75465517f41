"""Checkpoints' rules: on by default, off per user and per spec, retention, deletion with the
conversation, a failure that never costs the message, and every bad input a clear JSON error."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.checkpoints.test_checkpoints import LOADED, checkpoints_of, wait_turns
from tests.support.conversation_helpers import UserFactory, message, start_and_wait
from tests.support.fake_llm import FakeLLM, reply_finish, reply_text
from tests.support.live_server import Api, free_port

pytestmark = [
    pytest.mark.usefixtures("sandbox_images", "base_images"),
    pytest.mark.live_config("snapshot_settings"),
]
ZERO = "0" * 32


async def conversation(user: Api, fake_llm: FakeLLM, turns: int = 1) -> tuple[str, str]:
    """A conversation of `user` after its first turn: its id and sandbox id."""
    fake_llm.add(reply_text("hello"), reply_finish())
    task = await start_and_wait(user, within=LOADED, initial_message=message("hi"))
    assert task["status"] == "READY", task
    await wait_turns(user, task["app_conversation_id"], turns)
    return task["app_conversation_id"], task["sandbox_id"]


async def say(user: Api, fake_llm: FakeLLM, cid: str, text: str, turns: int) -> None:
    fake_llm.add(reply_text(text), reply_finish())
    await user.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message(text))
    await wait_turns(user, cid, turns)


@pytest.mark.live_config(checkpoint_keep_last=2)
async def test_retention_keeps_the_last_n_and_delete_takes_them_along(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice")
    cid, _ = await conversation(alice, fake_llm)
    for n in (2, 3, 4):
        await say(alice, fake_llm, cid, f"message {n}", n)
        await asyncio.sleep(1)  # its checkpoint stored before the next one is taken
    listed = await checkpoints_of(alice, cid)
    assert len(listed) == 2
    assert listed[0]["created_at"] > listed[1]["created_at"]  # newest first
    page = await alice.ok("GET", f"/api/v1/app-conversations/{cid}/checkpoints?limit=1")
    assert [c["id"] for c in page["items"]] == [listed[0]["id"]]
    rest = await alice.ok(
        "GET", f"/api/v1/app-conversations/{cid}/checkpoints?limit=1&page_id={page['next_page_id']}"
    )
    assert [c["id"] for c in rest["items"]] == [listed[1]["id"]]
    assert rest["next_page_id"] is None
    snapshots = (await alice.ok("GET", "/api/v1/snapshots/search"))["items"]
    assert sorted(s["id"] for s in snapshots) == sorted(c["snapshot_id"] for c in listed)

    await alice.ok("DELETE", f"/api/v1/app-conversations/{cid}")
    for checkpoint in listed:
        status, body = await alice.call("GET", f"/api/v1/snapshots/{checkpoint['snapshot_id']}")
        assert status == 404, body
    assert (await alice.ok("GET", "/api/v1/snapshots/search"))["items"] == []


@pytest.mark.live_config(snapshot_max_per_user=1)
async def test_a_failed_checkpoint_never_costs_the_message(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice")
    cid, _ = await conversation(alice, fake_llm)
    await say(alice, fake_llm, cid, "message 2", 2)
    await asyncio.sleep(1)
    # The per-user snapshot limit (1) refuses the next checkpoint: the message still goes.
    await say(alice, fake_llm, cid, "message 3", 3)
    assert len(await checkpoints_of(alice, cid)) == 1


@pytest.fixture
def store_down() -> dict[str, Any]:
    """A snapshot store that does not answer (a port nothing listens on)."""
    return {"snapshot_store_url": f"http://127.0.0.1:{free_port()}"}


@pytest.mark.live_config("snapshot_settings", "store_down")
async def test_a_store_that_is_down_costs_no_message(user: UserFactory, fake_llm: FakeLLM) -> None:
    alice = await user("alice")
    cid, _ = await conversation(alice, fake_llm)
    await say(alice, fake_llm, cid, "message 2", 2)  # delivered and answered all the same
    page = await alice.ok("GET", f"/api/v1/app-conversations/{cid}/checkpoints")
    assert page["items"] == []


async def test_off_per_user(user: UserFactory, fake_llm: FakeLLM) -> None:
    bob = await user("bob", enable_checkpoints=False)
    assert (await bob.ok("GET", "/api/settings"))["enable_checkpoints"] is False
    cid, _ = await conversation(bob, fake_llm)
    await say(bob, fake_llm, cid, "message 2", 2)
    await asyncio.sleep(1)
    page = await bob.ok("GET", f"/api/v1/app-conversations/{cid}/checkpoints")
    assert page == {"items": [], "next_page_id": None}


@pytest.fixture
def specs_without_checkpoints(tmp_path: Path) -> dict[str, Any]:
    """The shipped specs, the default one with `checkpoints: false`."""
    specs = Path(__file__).resolve().parents[2] / "specs"
    for source in specs.glob("*.yaml"):
        spec = yaml.safe_load(source.read_text())
        if spec.get("default"):
            spec["checkpoints"] = False
        (tmp_path / source.name).write_text(yaml.safe_dump(spec))
    return {"spec_dir": str(tmp_path)}


@pytest.mark.live_config("snapshot_settings", "specs_without_checkpoints")
async def test_off_per_spec(user: UserFactory, fake_llm: FakeLLM) -> None:
    alice = await user("alice")
    cid, _ = await conversation(alice, fake_llm)
    await say(alice, fake_llm, cid, "message 2", 2)
    await asyncio.sleep(1)
    page = await alice.ok("GET", f"/api/v1/app-conversations/{cid}/checkpoints")
    assert page["items"] == []


async def test_bad_inputs_are_clear_errors(user: UserFactory, fake_llm: FakeLLM) -> None:
    alice, mallory = await user("alice"), await user("mallory")
    cid, _ = await conversation(alice, fake_llm)
    await say(alice, fake_llm, cid, "message 2", 2)
    (checkpoint,) = await checkpoints_of(alice, cid)
    base = f"/api/v1/app-conversations/{cid}"

    for action in ("rewind", "fork"):
        status, body = await alice.call("POST", f"{base}/{action}", json={"checkpoint_id": ZERO})
        assert status == 404, body
        assert body["detail"] == f"checkpoint {ZERO} not found in conversation {cid}"
    status, body = await alice.call("POST", f"{base}/rewind", json={"checkpoint_id": "x"})
    assert status == 422, body
    status, body = await alice.call("POST", f"{base}/rewind", json={})
    assert status == 422, body
    status, body = await alice.call(
        "POST", f"{base}/rewind", json={"checkpoint_id": checkpoint["id"], "extra": 1}
    )
    assert status == 422, body
    missing = f"/api/v1/app-conversations/{ZERO}"
    status, body = await alice.call("GET", f"{missing}/checkpoints")
    assert status == 404, body

    # Another user's conversation does not exist for mallory, nor its checkpoints.
    for method, path, json_body in (
        ("GET", f"{base}/checkpoints", None),
        ("POST", f"{base}/rewind", {"checkpoint_id": checkpoint["id"]}),
        ("POST", f"{base}/fork", {"checkpoint_id": checkpoint["id"]}),
    ):
        status, body = await mallory.call(method, path, json=json_body)
        assert status == 404, (path, body)
        assert checkpoint["id"] not in str(body)

    # A checkpoint whose snapshot was deleted cannot be rewound to: a clear 409.
    await alice.ok("DELETE", f"/api/v1/snapshots/{checkpoint['snapshot_id']}")
    status, body = await alice.call(
        "POST", f"{base}/rewind", json={"checkpoint_id": checkpoint["id"]}
    )
    assert status == 409, body
    assert body["detail"].endswith("was deleted"), body


@pytest.mark.live_config(snapshot_store_url=None)
async def test_without_snapshots_the_routes_answer_503(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice")
    cid, _ = await conversation(alice, fake_llm)
    await say(alice, fake_llm, cid, "message 2", 2)  # no checkpoint, and no harm
    base = f"/api/v1/app-conversations/{cid}"
    for method, path, json_body in (
        ("GET", f"{base}/checkpoints", None),
        ("POST", f"{base}/rewind", {"checkpoint_id": ZERO}),
        ("POST", f"{base}/fork", {"checkpoint_id": ZERO}),
    ):
        status, body = await alice.call(method, path, json=json_body)
        assert status == 503, (path, body)
        assert "ACS_SNAPSHOT_STORE_URL is unset" in body["detail"]
