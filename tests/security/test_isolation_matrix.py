"""Tenant isolation, attacked as another user would: every route of /api/openapi.json, as bob,
against alice's objects and against random ids.

For each route and each id it takes (path, query or body), bob sends the request twice: once
with alice's id, once with a random one. The two answers must be indistinguishable (same status;
for errors the same body once the id is masked), no answer may carry alice's private data, and
at the end nothing of alice's has changed. The one difference allowed is documented: a
client-chosen conversation id that exists is refused with 409 (docs/conversations.md).

A route this module does not know how to fill fails the test with what to add, so new routes
join the matrix when they are written.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.conversation_helpers import (
    UserFactory,
    message,
    start_and_wait,
    wait_events,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.live_server import Api, running_sandbox

# Snapshots on (the registry of the session, a repository of the test's own): the snapshot and
# checkpoint routes are attacked on alice's real snapshot and checkpoint.
pytestmark = [
    pytest.mark.usefixtures("sandbox_images", "base_images"),
    pytest.mark.live_config("snapshot_settings"),
]

PRIVATE_TEXT = "alice-private-" + secrets.token_hex(6)
SECRET_VALUE = "alice-secret-value-" + secrets.token_hex(6)
TITLE = "alice-title-" + secrets.token_hex(6)
TERMINAL = ("READY", "ERROR")


@dataclass
class Ids:
    """One set of ids to put in requests: alice's real ones, or random ones of the same form."""

    sandbox: str
    conversation: str
    task: str
    event: str
    secret: str
    user: str
    key: str
    """An API key's id."""
    snapshot: str
    checkpoint: str


@dataclass
class Alice:
    api: Api
    ids: Ids
    sandbox_key: str
    private: list[str] = field(default_factory=list)


def random_ids() -> Ids:
    return Ids(
        sandbox=secrets.token_hex(16),
        conversation=uuid.uuid4().hex,
        task=uuid.uuid4().hex,
        event=str(uuid.uuid4()),
        secret="S_" + secrets.token_hex(4).upper(),
        user="user-" + secrets.token_hex(4),
        key=secrets.token_hex(6),
        snapshot=uuid.uuid4().hex,
        checkpoint=uuid.uuid4().hex,
    )


def event_body(ids: Ids) -> list[dict[str, Any]]:
    stamp = datetime.now(UTC).isoformat()
    return [
        {
            "id": str(uuid.uuid4()),
            "kind": "MessageEvent",
            "timestamp": stamp,
            "source": "agent",
            "llm_message": {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
        }
    ]


# Bodies per route: each function gives the variants to send, as (name of the id it carries,
# body). `bob_sandbox` is bob's own sandbox, where a take-over would run.
BodyVariants = Callable[[Ids, str], list[tuple[str, Any]]]


def _start_bodies(ids: Ids, bob_sandbox: str) -> list[tuple[str, Any]]:
    return [
        ("conversation_id", {"conversation_id": ids.conversation, "sandbox_id": bob_sandbox}),
        ("sandbox_id", {"sandbox_id": ids.sandbox}),
        ("parent_conversation_id", {"parent_conversation_id": ids.conversation}),
    ]


def _chat_body(ids: Ids, _b: str) -> list[tuple[str, Any]]:
    """A model call carries no ids: bob's API key is no gateway credential either way."""
    return [("-", {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]})]


PROFILE_BODY = {"llm": {"model": "bob-model", "api_key": "bob-key"}, "include_secrets": True}

BODIES: dict[tuple[str, str], BodyVariants] = {
    ("POST", "/api/v1/llm-gateway/v1/chat/completions"): _chat_body,
    ("POST", "/api/v1/llm-gateway/chat/completions"): _chat_body,
    ("POST", "/api/settings"): lambda ids, _b: [("-", {"language": "en"})],
    ("POST", "/api/v1/settings"): lambda ids, _b: [("-", {"language": "en"})],
    # Sign-in and the device flow carry no user's ids: bob gets the same answers either way.
    ("POST", "/auth/sign-in"): lambda ids, _b: [("-", {"api_key": "acs_not_a_key"})],
    ("POST", "/oauth/device/token"): lambda ids, _b: [("-", {"device_code": "not-a-code"})],
    ("POST", "/oauth/device/verify"): lambda ids, _b: [
        ("-", {"user_code": "BCDF-GHJK", "action": "deny"})
    ],
    ("POST", "/api/add-git-providers"): lambda ids, _b: [("-", {})],
    # Secret names are per user: bob's own secret must not share the name PUT/DELETE probe.
    ("POST", "/api/secrets"): lambda ids, _b: [
        ("name", {"name": ids.secret + "_BOB", "value": "bob's"})
    ],
    ("PUT", "/api/secrets/{name}"): lambda ids, _b: [("-", {"description": "changed by bob"})],
    ("POST", "/api/v1/sandboxes"): lambda ids, _b: [
        ("-", {}),
        ("snapshot_id", {"snapshot_id": ids.snapshot}),
    ],
    # Snapshots and checkpoints: bob names alice's sandbox, snapshot or checkpoint.
    ("POST", "/api/v1/sandboxes/{sandbox_id}/snapshots"): lambda ids, _b: [
        ("-", {"name": "by bob"})
    ],
    ("POST", "/api/v1/sandboxes/{sandbox_id}/fork"): lambda ids, _b: [("-", {"count": 1})],
    ("POST", "/api/v1/app-conversations/{conversation_id}/rewind"): lambda ids, _b: [
        ("checkpoint_id", {"checkpoint_id": ids.checkpoint})
    ],
    ("POST", "/api/v1/app-conversations/{conversation_id}/fork"): lambda ids, _b: [
        ("checkpoint_id", {"checkpoint_id": ids.checkpoint})
    ],
    ("POST", "/api/v1/app-conversations"): _start_bodies,
    ("POST", "/api/v1/app-conversations/stream-start"): _start_bodies,
    ("PATCH", "/api/v1/app-conversations/{conversation_id}"): lambda ids, _b: [
        ("-", {"title": "renamed by bob", "public": True, "selected_repository": None})
    ],
    ("POST", "/api/v1/conversations/{conversation_id}/pending-messages"): lambda ids, _b: [
        ("-", message("queued by bob"))
    ],
    ("PATCH", "/api/conversations/{conversation_id}"): lambda ids, _b: [
        ("-", {"title": "renamed by bob"})
    ],
    ("POST", "/api/v1/app-conversations/{conversation_id}/events"): lambda ids, _b: [
        ("-", message("bob was here"))
    ],
    ("POST", "/api/v1/app-conversations/{conversation_id}/respond_to_confirmation"): (
        lambda ids, _b: [("-", {"accept": True})]
    ),
    ("POST", "/api/v1/webhooks/{sandbox_id}/events/{conversation_id}"): lambda ids, _b: [
        ("-", event_body(ids))
    ],
    ("POST", "/api/v1/webhooks/{sandbox_id}/conversations"): lambda ids, _b: [
        ("id", {"id": ids.conversation, "execution_status": "error"})
    ],
    # The V0 start takes no id: bob starts a conversation of his own.
    ("POST", "/api/conversations"): lambda ids, _b: [("-", {"initial_user_msg": "bob's"})],
    # Profiles are per user: bob's writes make or touch his own.
    ("POST", "/api/v1/settings/profiles/{name}"): lambda ids, _b: [("-", PROFILE_BODY)],
    ("POST", "/api/organizations/{org_id}/profiles/{name}"): lambda ids, _b: [("-", PROFILE_BODY)],
    ("POST", "/api/v1/settings/profiles/{name}/rename"): lambda ids, _b: [
        ("-", {"new_name": "renamed-by-bob"})
    ],
    ("POST", "/api/organizations/{org_id}/profiles/{name}/rename"): lambda ids, _b: [
        ("-", {"new_name": "renamed-by-bob"})
    ],
    ("POST", "/api/v1/settings/profiles/{name}/activate"): lambda ids, _b: [("-", {})],
    ("POST", "/api/organizations/{org_id}/profiles/{name}/activate"): lambda ids, _b: [("-", {})],
    ("POST", "/api/agent-profiles/{name}"): lambda ids, _b: [("-", {"name": "x"})],
    ("POST", "/api/agent-profiles/{name}/rename"): lambda ids, _b: [("-", {"new_name": "x"})],
    # The envelope carries no id of its own; cloud-proxy's attacks are in test_cloud_proxy.py.
    ("POST", "/api/cloud-proxy"): lambda ids, _b: [
        ("-", {"host": "http://127.0.0.1:1", "path": "/api/conversations", "headers": {}})
    ],
    # A ticket is minted only for the caller's own conversation or sandbox.
    ("POST", "/api/v1/websocket-tickets"): lambda ids, _b: [
        ("conversation_id", {"conversation_id": ids.conversation}),
        ("sandbox_id", {"sandbox_id": ids.sandbox}),
    ],
    # Organizations: bob, a member of the default organization, changes nothing of it.
    ("POST", "/api/organizations"): lambda ids, _b: [("-", {"id": "bobs-org", "name": "B"})],
    ("PATCH", "/api/organizations/{org_id}"): lambda ids, _b: [("-", {"name": "by bob"})],
    ("PUT", "/api/organizations/{org_id}/members/{user_id}"): lambda ids, _b: [
        ("-", {"role": "owner"})
    ],
    # Keys carry no id of another's: bob makes one of his own.
    ("POST", "/api/v1/keys"): lambda ids, _b: [("-", {"name": "bob's"})],
}

# The documented difference: an existing client-chosen conversation id is refused with 409,
# a fresh one starts a conversation.
ALLOWED: dict[tuple[str, str, str], tuple[int, int]] = {
    ("POST", "/api/v1/app-conversations", "conversation_id"): (409, 200),
    ("POST", "/api/v1/app-conversations/stream-start", "conversation_id"): (409, 200),
    # Bob's own gateway key, which carries no id: revoked by the first call, gone for the next.
    ("DELETE", "/api/keys/llm/byor", "-"): (204, 404),
}

PATH_IDS: dict[str, Callable[[Ids], str]] = {
    "sandbox_id": lambda i: i.sandbox,
    "conversation_id": lambda i: i.conversation,
    "name": lambda i: i.secret,  # a secret's, an LLM profile's (alice has both) or agent profile's
    "secret_name": lambda i: i.secret,
    "org_id": lambda _i: "deployment",  # the default organization: alice's and bob's
    "user_id": lambda i: i.user,
    "key_id": lambda i: i.key,
    "snapshot_id": lambda i: i.snapshot,
    # The sandbox proxy: the agent server's port and a path it serves.
    "port": lambda _i: "agent",
    "path": lambda _i: "api/conversations/search",
}


QUERY_IDS: dict[str, Callable[[Ids], str]] = {
    "conversation_id": lambda i: i.conversation,
    "conversation_id__eq": lambda i: i.conversation,
    "sandbox_id": lambda i: i.sandbox,
    "sandbox_id__eq": lambda i: i.sandbox,
    "created_by_user_id": lambda i: i.user,
    "user_id": lambda i: i.user,
    "after": lambda i: i.event,
    "all_users": lambda _i: "true",  # the admin-only switch, tried as bob
    "target": lambda i: i.sandbox,  # the audit log's: entries about alice's sandbox
    "org_id": lambda _i: "deployment",  # alice's and bob's organization
    "path": lambda _i: "/workspace/project",  # a place in a sandbox: no id of its own
    "file_path": lambda _i: "/workspace/project",
}


def query_id(path: str, name: str) -> Callable[[Ids], str] | None:
    """The id a query parameter carries, or None when it carries none."""
    if name in QUERY_IDS:
        return QUERY_IDS[name]
    if name in ("id", "ids"):
        if path.startswith("/api/v1/sandbox-specs"):
            return lambda _i: "default"  # templates are shared, not user data
        if "start-tasks" in path:
            return lambda i: i.task
        if path.startswith("/api/v1/sandboxes"):
            return lambda i: i.sandbox
        if path.startswith("/api/v1/events"):
            return lambda i: i.event
        if path.startswith("/api/v1/app-conversations"):
            return lambda i: i.conversation
    return None


# Query parameters that carry no user data of their own.
NEUTRAL_QUERY = {
    "page_id", "limit", "sort_order", "status", "sandbox_spec_id", "title__contains",
    "created_at__gte", "created_at__lt", "updated_at__gte", "updated_at__lt", "kind__eq",
    "timestamp__gte", "timestamp__lt", "include_sub_conversations", "last_activity_at__lt",
    "last_activity_at__gte", "resend_all", "session_api_key", "query", "verified__eq",
    "provider__eq", "selected_repository", "conversation_trigger", "expose_secrets",
    "agent_profile_id", "returnTo", "path", "ref", "file_path", "acs_ticket",
    "action", "since", "until",
}  # fmt: skip


@dataclass
class Probe:
    method: str
    template: str
    carries: str
    path: Callable[[Ids], str]
    query: Callable[[Ids], dict[str, str]]
    body: Callable[[Ids], Any] | None


def probes_of(doc: dict[str, Any], bob_sandbox: str) -> list[Probe]:
    """Every (route, id-carrying input) of the OpenAPI document as requests to send twice."""
    out: list[Probe] = []
    missing: list[str] = []
    for template, operations in doc["paths"].items():
        for verb, op in operations.items():
            out += route_probes(verb.upper(), template, op, bob_sandbox, missing)
    assert not missing, "routes the isolation matrix cannot fill yet:\n" + "\n".join(missing)
    return out


def route_probes(
    method: str, template: str, op: dict[str, Any], bob_sandbox: str, missing: list[str]
) -> list[Probe]:
    params = op.get("parameters", [])
    path_names = [p["name"] for p in params if p["in"] == "path"]
    unknown = [n for n in path_names if n not in PATH_IDS]
    if unknown:
        missing.append(f"{method} {template}: path parameter(s) {unknown} (PATH_IDS)")
        return []

    def fill(ids: Ids) -> str:
        path = template
        for name in path_names:
            path = path.replace("{" + name + "}", PATH_IDS[name](ids))
        return path

    bodies: list[tuple[str, Callable[[Ids], Any] | None]] = [("-", None)]
    variants = BODIES.get((method, template))
    if variants is None and "requestBody" in op:
        missing.append(f"{method} {template}: a request body (BODIES)")
        return []
    if variants is not None:
        names = [name for name, _ in variants(random_ids(), bob_sandbox)]
        bodies = [
            (name, lambda ids, n=index, v=variants: v(ids, bob_sandbox)[n][1])  # type: ignore[misc]  # defaults bind the loop values
            for index, name in enumerate(names)
        ]
    required = [
        (p["name"], query_id(template, p["name"]))
        for p in params
        if p["in"] == "query" and p.get("required")
    ]

    def base_query(ids: Ids) -> dict[str, str]:
        return {name: carry(ids) for name, carry in required if carry is not None}

    out = [Probe(method, template, name, fill, base_query, body) for name, body in bodies]
    for p in params:
        if p["in"] != "query":
            continue
        carry = query_id(template, p["name"])
        if carry is None:
            if p.get("required") or p["name"] not in NEUTRAL_QUERY:
                missing.append(f"{method} {template}: query parameter {p['name']!r}")
            continue

        def query(ids: Ids, n: str = p["name"], c: Callable[[Ids], str] = carry) -> dict[str, str]:
            return base_query(ids) | {n: c(ids)}

        out.append(Probe(method, template, p["name"], fill, query, bodies[0][1]))
    return out


def masked(text: str, ids: Ids) -> str:
    for value in (
        ids.sandbox,
        ids.conversation,
        ids.task,
        ids.event,
        ids.secret,
        ids.user,
        ids.key,
        ids.snapshot,
        ids.checkpoint,
    ):
        text = text.replace(value, "<id>")
    return text


async def send(api: Api, probe: Probe, ids: Ids, headers: dict[str, str]) -> tuple[int, str]:
    kwargs: dict[str, Any] = {"params": probe.query(ids), "headers": headers}
    if probe.body is not None:
        kwargs["json"] = probe.body(ids)
    async with api.http.request(probe.method, api.base + probe.path(ids), **kwargs) as resp:
        return resp.status, await resp.text()


async def snapshot(alice: Alice) -> dict[str, Any]:
    api, ids = alice.api, alice.ids
    conversation = await api.ok("GET", f"/api/v1/app-conversations/{ids.conversation}")
    sandbox = await api.ok("GET", f"/api/v1/sandboxes/{ids.sandbox}")
    events = await api.ok(
        "GET", f"/api/v1/events/search?conversation_id__eq={ids.conversation}&limit=100"
    )
    return {
        "conversation": {
            k: conversation[k]
            for k in ("id", "title", "sandbox_id", "created_by_user_id", "created_at")
        },
        "sandbox": {k: sandbox[k] for k in ("id", "status", "session_api_key")},
        "events": [e["id"] for e in events["items"]],
        "event_count": await api.ok(
            "GET", f"/api/v1/events/count?conversation_id__eq={ids.conversation}"
        ),
        "by_id": await api.ok("GET", f"/api/v1/events?id={ids.event}"),
        "pending": await api.ok(
            "GET", f"/api/v1/conversations/{ids.conversation}/pending-messages"
        ),
        "public": conversation["public"],
        "settings": await api.ok("GET", "/api/settings"),
        "secrets": await api.ok("GET", "/api/secrets"),
        "profiles": await api.ok("GET", "/api/v1/settings/profiles"),
        "tasks": (await api.ok("GET", "/api/v1/app-conversations/start-tasks/search"))["items"],
        "conversations": (await api.ok("GET", "/api/v1/app-conversations/search"))["items"][0][
            "id"
        ],
        "snapshots": [
            {k: s[k] for k in ("id", "name", "sandbox_id")}
            for s in (await api.ok("GET", "/api/v1/snapshots/search"))["items"]
        ],
        "checkpoints": [
            c["id"]
            for c in (
                await api.ok("GET", f"/api/v1/app-conversations/{ids.conversation}/checkpoints")
            )["items"]
        ],
    }


async def settle(api: Api, within: float = 90) -> None:
    """Wait until none of the caller's start tasks is still running."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        tasks = (await api.ok("GET", "/api/v1/app-conversations/start-tasks/search"))["items"]
        if all(t["status"] in TERMINAL for t in tasks):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("bob's start tasks never finished")


def runs_finished(events: list[dict[str, Any]]) -> int:
    return sum(
        1
        for e in events
        if e["kind"] == "ConversationStateUpdateEvent"
        and e.get("key") == "execution_status"
        and e.get("value") == "finished"
    )


async def first_checkpoint(api: Api, cid: str, within: float = 120) -> str:
    """The id of the conversation's first checkpoint, once it is listed (stored in the
    background after its message went on)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        page = await api.ok("GET", f"/api/v1/app-conversations/{cid}/checkpoints")
        if page["items"]:
            return str(page["items"][-1]["id"])
        await asyncio.sleep(0.5)
    raise AssertionError(f"no checkpoint of {cid} listed in {within} s")


async def make_alice(user: UserFactory, fake_llm: FakeLLM) -> Alice:
    api = await user("alice")
    await api.ok("POST", "/api/secrets", json={"name": "ALICE_TOKEN", "value": SECRET_VALUE})
    profile = {"llm": {"model": "alice-model", "api_key": SECRET_VALUE}, "include_secrets": True}
    await api.ok("POST", "/api/v1/settings/profiles/ALICE_TOKEN", json=profile)
    fake_llm.script([reply_tool_call("terminal", {"command": "echo hi"}), reply_finish()])
    task = await start_and_wait(api, initial_message=message(PRIVATE_TEXT), title=TITLE)
    assert task["status"] == "READY", task
    cid = task["app_conversation_id"]
    await wait_finished(api, cid)
    # A second message: its checkpoint (taken before it goes to the agent) is alice's.
    fake_llm.script([reply_finish()])
    await api.ok("POST", f"/api/v1/app-conversations/{cid}/events", json=message("again"))
    checkpoint = await first_checkpoint(api, cid)
    events = await wait_events(api, cid, lambda found: runs_finished(found) == 2)
    named = await api.ok(
        "POST", f"/api/v1/sandboxes/{task['sandbox_id']}/snapshots", json={"name": "alice's"}
    )
    sandbox = await api.ok("GET", f"/api/v1/sandboxes/{task['sandbox_id']}")
    ids = Ids(
        sandbox=task["sandbox_id"],
        conversation=cid,
        task=task["id"],
        event=events[0]["id"],
        secret="ALICE_TOKEN",
        user="alice",
        key=api.key.split("_")[1],
        snapshot=named["id"],
        checkpoint=checkpoint,
    )
    private = [PRIVATE_TEXT, SECRET_VALUE, TITLE, api.key, sandbox["session_api_key"]]
    private += [e["id"] for e in events]
    return Alice(api, ids, sandbox["session_api_key"], private)


async def test_bob_reaches_nothing_of_alice_on_any_route(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await make_alice(user, fake_llm)
    bob = await user("bob")
    bob_sandbox = await running_sandbox(bob)
    before = await snapshot(alice)
    doc = await bob.ok("GET", "/api/openapi.json")
    probes = probes_of(doc, bob_sandbox["id"])
    assert len(probes) > 40, "the matrix should walk every route"

    failures: list[str] = []
    for probe in probes:
        # Sandbox-authenticated routes: bob's own sandbox key is his credential there.
        webhook = probe.template.startswith("/api/v1/webhooks/") or "/settings/secrets" in (
            probe.template
        )
        headers = {"X-Session-API-Key": bob_sandbox["session_api_key"] if webhook else bob.key}
        pairs = [(alice.ids, random_ids())]
        if webhook:
            # Bob's own sandbox key on his own sandbox, aimed at alice's conversation.
            theirs = random_ids()
            pairs.append(
                (
                    Ids(**(vars(alice.ids) | {"sandbox": bob_sandbox["id"]})),
                    Ids(**(vars(theirs) | {"sandbox": bob_sandbox["id"]})),
                )
            )
        for alice_ids, other in pairs:
            status_a, text_a = await send(bob, probe, alice_ids, headers)
            status_r, text_r = await send(bob, probe, other, headers)
            where = f"{probe.method} {probe.template} [{probe.carries}]"
            allowed = ALLOWED.get((probe.method, probe.template, probe.carries))
            if allowed is not None and (status_a, status_r) == allowed:
                pass
            elif status_a != status_r:
                failures.append(f"{where}: alice's id → {status_a}, a random id → {status_r}")
            elif status_a >= 300 and masked(text_a, alice_ids) != masked(text_r, other):
                failures.append(f"{where}: bodies differ: {text_a[:200]!r} / {text_r[:200]!r}")
            supplied = set(vars(alice_ids).values())
            leaked = [p for p in alice.private if p in text_a and p not in supplied]
            if leaked:
                failures.append(f"{where}: the answer carries alice's data {leaked}")
            if status_a >= 500:
                failures.append(f"{where}: {status_a} {text_a[:200]}")
    await settle(bob)
    try:
        after = await snapshot(alice)
    except AssertionError as exc:
        failures.append(f"alice's own reads fail after bob's requests: {exc}")
    assert not failures, "\n".join(failures)
    assert after == before, json.dumps({"before": before, "after": after}, indent=1)


async def test_client_chosen_conversation_ids_are_never_a_capability(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish(), reply_finish(), reply_finish()])
    alice, bob = await user("alice"), await user("bob")
    chosen = str(uuid.uuid4())
    task = await start_and_wait(alice, conversation_id=chosen)
    assert task["status"] == "READY", task
    plain = chosen.replace("-", "")
    assert task["app_conversation_id"] == plain

    status, again = await alice.call(
        "POST", "/api/v1/app-conversations", json={"conversation_id": chosen}
    )
    assert status == 409, again
    for form in (chosen, plain, chosen.upper()):
        status, body = await bob.call(
            "POST", "/api/v1/app-conversations", json={"conversation_id": form}
        )
        assert status == 409, body
        # Nothing tells bob whose the id is.
        assert body["detail"].replace(form.replace("-", "").lower(), "<id>") == again[
            "detail"
        ].replace(plain, "<id>")

    # A start that failed leaves the id to its owner, who may try again with it.
    carol = await user("carol", llm_model=None)
    retry = str(uuid.uuid4())
    failed = await start_and_wait(carol, conversation_id=retry)
    assert failed["status"] == "ERROR", failed
    assert (await bob.call("POST", "/api/v1/app-conversations", json={"conversation_id": retry}))[
        0
    ] == 409
    await carol.ok("POST", "/api/settings", json={"llm_model": "fake-model"})
    second = await start_and_wait(carol, conversation_id=retry)
    assert second["status"] == "READY", second

    # After a delete the id stays its owner's: bob still cannot take it.
    await alice.ok("DELETE", f"/api/v1/app-conversations/{plain}")
    status, _ = await bob.call("POST", "/api/v1/app-conversations", json={"conversation_id": plain})
    assert status == 409


async def test_an_agent_cannot_squat_or_remove_another_conversations_event_ids(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish(), reply_finish()])
    alice, bob = await user("alice"), await user("bob")
    mine = await start_and_wait(alice, initial_message=message("hello"))
    theirs = await start_and_wait(bob, initial_message=message("hello"))
    cid, bob_cid = mine["app_conversation_id"], theirs["app_conversation_id"]
    events = await wait_finished(alice, cid)
    await wait_finished(bob, bob_cid)
    target = events[0]
    bob_box = await bob.ok("GET", f"/api/v1/sandboxes/{theirs['sandbox_id']}")

    # Bob's sandbox posts an event reusing alice's event id into bob's own conversation.
    forged = dict(target, timestamp=datetime.now(UTC).isoformat())
    async with bob.http.post(
        f"{bob.base}/api/v1/webhooks/{bob_box['id']}/events/{bob_cid}",
        json=[forged],
        headers={"X-Session-API-Key": bob_box["session_api_key"]},
    ) as resp:
        assert resp.status == 200, await resp.text()
    assert await alice.ok("GET", f"/api/v1/events?id={target['id']}") == [target]
    assert await bob.ok("GET", f"/api/v1/events?id={target['id']}") == [None]
    await bob.ok("DELETE", f"/api/v1/app-conversations/{bob_cid}")
    assert await alice.ok("GET", f"/api/v1/events?id={target['id']}") == [target]
    count = await alice.ok("GET", f"/api/v1/events/count?conversation_id__eq={cid}")
    assert count == len(events)
