"""Each role by each action, on real sandboxes (Docker) and real records: an owner, an admin, a
member and an auditor of one organization, and the owner of another, act on a third member's
sandbox, conversation and usage, on their own sandboxes, and on the members. Every refusal is
the status docs/api.md states: 404 where the caller may not see the thing (another member's
sandbox for a member, anything of another organization, anyone's conversation), 403 where they
see it but their role may not do that (an auditor's pause, a member's member change).

Every action walked has its audit entry, refusals included (who, the outcome, the status), and
the audit search answers each role as docs/api.md says: the organization's owners, admins and
auditors read its entries, members 403, another organization's 404.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from tests.conftest import BOOTSTRAP_KEY
from tests.support.sandbox_helpers import wait_status
from tests.support.types import Client

pytestmark = pytest.mark.timeout(240)
ADMIN_KEY = {"X-Session-API-Key": BOOTSTRAP_KEY}
ROLES = ("owner", "admin", "member", "auditor", "outsider")
AUDIT = "/api/v1/audit-events/search"
USERS = {"owner": "olivia", "admin": "ada", "member": "bob", "auditor": "aud", "outsider": "sam"}


async def audited(client: Client, **filters: str) -> list[tuple[str, str | None, str, int | None]]:
    """(action, who, outcome, status) of the entries matching `filters`, oldest first, as the
    deployment admin reads them."""
    page = await ok(client, "GET", AUDIT, ADMIN_KEY, params=filters)
    assert page["next_page_id"] is None
    return [
        (
            e["event"]["action"],
            e["user"]["id"],
            e["event"]["outcome"],
            (e["http"] or {}).get("response", {}).get("status_code") if e["http"] else None,
        )
        for e in reversed(page["items"])
    ]


async def call(client: Client, method: str, path: str, who: dict[str, str], **kw: Any) -> int:
    async with client.request(method, path, headers=who, **kw) as response:
        await response.read()
        return response.status


async def ok(client: Client, method: str, path: str, who: dict[str, str], **kw: Any) -> Any:
    async with client.request(method, path, headers=who, **kw) as response:
        body = await response.json()
        assert response.status < 300, (method, path, response.status, body)
        return body


@pytest.fixture
async def people(sbx: Client, raw_redis: aioredis.Redis) -> dict[str, dict[str, str]]:
    """eng: olivia owner, ada admin, bob member, aud auditor, mia member (the target);
    sales: sam owner. Each with an API key made in their organization."""
    await ok(sbx, "POST", "/api/organizations", ADMIN_KEY, json={"id": "eng", "name": "Eng",
                                                                  "owner": "olivia"})  # fmt: skip
    await ok(sbx, "POST", "/api/organizations", ADMIN_KEY, json={"id": "sales", "name": "Sales",
                                                                  "owner": "sam"})  # fmt: skip
    for user, role in (("ada", "admin"), ("bob", "member"), ("aud", "auditor"), ("mia", "member")):
        await ok(sbx, "PUT", f"/api/organizations/eng/members/{user}", ADMIN_KEY,
                 json={"role": role})  # fmt: skip
    keys = ApiKeyService(raw_redis, None)
    orgs = {"olivia": "eng", "ada": "eng", "bob": "eng", "aud": "eng", "mia": "eng", "sam": "sales"}
    headers = {}
    for user, org in orgs.items():
        headers[user] = {"X-Session-API-Key": (await keys.create(user, org_id=org)).key}
    return {
        "owner": headers["olivia"],
        "admin": headers["ada"],
        "member": headers["bob"],
        "auditor": headers["aud"],
        "outsider": headers["sam"],
        "target": headers["mia"],
    }


async def test_each_role_on_another_members_things(
    sbx: Client, people: dict[str, dict[str, str]], raw_redis: aioredis.Redis
) -> None:
    target = people["target"]
    sandbox = (await ok(sbx, "POST", "/api/v1/sandboxes", target, json={}))["id"]
    assert (await wait_status(sbx, target, sandbox, "RUNNING", within=90))["org_id"] == "eng"
    conversation = uuid.uuid4().hex
    await ConversationStore(raw_redis).create(
        AppConversationInfo(id=conversation, created_by_user_id="mia", sandbox_id=sandbox)
    )
    assert await call(sbx, "GET", f"/api/v1/app-conversations/{conversation}", target) == 200

    listed: dict[str, bool | int] = {}
    for role in ROLES:
        who = people[role]
        status = await call(sbx, "GET", "/api/v1/sandboxes/search?all_users=true", who)
        if status == 200:
            page = await ok(sbx, "GET", "/api/v1/sandboxes/search?all_users=true", who)
            listed[role] = sandbox in {s["id"] for s in page["items"]}
        else:
            listed[role] = status
    assert listed == {"owner": True, "admin": True, "member": 403, "auditor": True,
                      "outsider": False}  # fmt: skip

    seen = {r: await call(sbx, "GET", f"/api/v1/sandboxes/{sandbox}", people[r]) for r in ROLES}
    assert seen == {"owner": 200, "admin": 200, "member": 404, "auditor": 200, "outsider": 404}
    view = await ok(sbx, "GET", f"/api/v1/sandboxes/{sandbox}", people["admin"])
    assert view["session_api_key"] is None  # an admin sees the state, never the key
    assert all(u["url"].count("tkn=") == 0 for u in view["exposed_urls"] or [])

    reads = {
        r: await call(sbx, "GET", f"/api/v1/app-conversations/{conversation}", people[r])
        for r in ROLES
    }
    assert reads == dict.fromkeys(ROLES, 404)  # nobody reads a member's conversation
    events = {
        r: await call(sbx, "GET", f"/api/v1/conversation/{conversation}/events/search", people[r])
        for r in ROLES
    }
    assert set(events.values()) == {404}

    usage = {
        r: await call(sbx, "GET", "/api/v1/llm-gateway/usage?user_id=mia", people[r]) for r in ROLES
    }
    assert usage == {"owner": 200, "admin": 200, "member": 404, "auditor": 200, "outsider": 404}

    pause = f"/api/v1/sandboxes/{sandbox}/pause"
    paused = {r: await call(sbx, "POST", pause, people[r]) for r in ("member", "auditor",
                                                                      "outsider")}  # fmt: skip
    assert paused == {"member": 404, "auditor": 403, "outsider": 404}
    assert (await ok(sbx, "GET", f"/api/v1/sandboxes/{sandbox}", target))["status"] == "RUNNING"
    assert await call(sbx, "POST", pause, people["admin"]) == 200
    assert (await ok(sbx, "GET", f"/api/v1/sandboxes/{sandbox}", target))["status"] == "PAUSED"
    assert await call(sbx, "POST", f"/api/v1/sandboxes/{sandbox}/resume", people["owner"]) == 200

    delete = f"/api/v1/sandboxes/{sandbox}"
    deleted = {r: await call(sbx, "DELETE", delete, people[r]) for r in ("member", "auditor",
                                                                         "outsider")}  # fmt: skip
    assert deleted == {"member": 404, "auditor": 403, "outsider": 404}
    assert await call(sbx, "GET", delete, target) == 200  # still there
    assert await call(sbx, "DELETE", delete, people["admin"]) == 200
    assert await call(sbx, "GET", delete, target) == 404

    # Each action on the sandbox has its entry, each refusal too (the outsider's is in their
    # own organization's log: what they reached for is not theirs to see).
    assert await audited(sbx, target=sandbox) == [
        ("sandbox.create", "mia", "success", None),
        ("sandbox.pause", "bob", "failure", 404),
        ("sandbox.pause", "aud", "failure", 403),
        ("sandbox.pause", "sam", "failure", 404),
        ("sandbox.pause", "ada", "success", None),
        ("sandbox.resume", "olivia", "success", None),
        ("sandbox.delete", "bob", "failure", 404),
        ("sandbox.delete", "aud", "failure", 403),
        ("sandbox.delete", "sam", "failure", 404),
        ("sandbox.delete", "ada", "success", None),
    ]
    searched = {r: await call(sbx, "GET", f"{AUDIT}?target={sandbox}", people[r]) for r in ROLES}
    assert searched == {"owner": 200, "admin": 200, "member": 403, "auditor": 200,
                        "outsider": 200}  # fmt: skip
    seen_by = {}
    for role in ("owner", "admin", "auditor", "outsider"):
        page = await ok(sbx, "GET", f"{AUDIT}?target={sandbox}", people[role])
        seen_by[role] = {(e["event"]["action"], e["user"]["id"]) for e in page["items"]}
    assert seen_by["owner"] == seen_by["admin"] == seen_by["auditor"]
    assert ("sandbox.delete", "ada") in seen_by["auditor"]
    assert ("sandbox.pause", "sam") not in seen_by["auditor"]  # sales' entry, not eng's
    assert seen_by["outsider"] == {("sandbox.pause", "sam"), ("sandbox.delete", "sam")}
    other = {r: await call(sbx, "GET", f"{AUDIT}?org_id=sales", people[r]) for r in ROLES}
    assert other == {"owner": 404, "admin": 404, "member": 404, "auditor": 404,
                     "outsider": 200}  # fmt: skip


async def test_each_role_on_its_own_sandboxes(
    sbx: Client, people: dict[str, dict[str, str]]
) -> None:
    made = {}
    for role in ("owner", "admin", "member", "auditor"):
        async with sbx.post("/api/v1/sandboxes", json={}, headers=people[role]) as response:
            made[role] = (response.status, await response.json())
    assert {r: s for r, (s, _) in made.items()} == {
        "owner": 200, "admin": 200, "member": 200, "auditor": 403,
    }  # fmt: skip
    for role in ("owner", "admin", "member"):
        sandbox = made[role][1]["id"]
        own = await ok(sbx, "GET", f"/api/v1/sandboxes/{sandbox}", people[role])
        assert own["created_by_user_id"] != "mia"
        assert own["org_id"] == "eng"
        assert await call(sbx, "DELETE", f"/api/v1/sandboxes/{sandbox}", people[role]) == 200


async def test_member_changes_by_role_and_no_self_escalation(
    sbx: Client, people: dict[str, dict[str, str]]
) -> None:
    bob = "/api/organizations/eng/members/bob"
    changes = {r: await call(sbx, "PUT", bob, people[r], json={"role": "member"}) for r in ROLES}
    assert changes == {"owner": 200, "admin": 200, "member": 403, "auditor": 403,
                       "outsider": 404}  # fmt: skip
    listing = {r: await call(sbx, "GET", "/api/organizations/eng/members", people[r])
               for r in ROLES}  # fmt: skip
    assert listing == {"owner": 200, "admin": 200, "member": 403, "auditor": 200, "outsider": 404}

    # Escalation: a member making themselves admin, an admin making themselves (or anyone)
    # owner, an auditor anything.
    assert await call(sbx, "PUT", bob, people["member"], json={"role": "admin"}) == 403
    ada = "/api/organizations/eng/members/ada"
    assert await call(sbx, "PUT", ada, people["admin"], json={"role": "owner"}) == 403
    assert await call(sbx, "PUT", bob, people["admin"], json={"role": "owner"}) == 403
    assert await call(sbx, "PUT", ada, people["auditor"], json={"role": "member"}) == 403
    roles = {
        m["user_id"]: m["role"]
        for m in (await ok(sbx, "GET", "/api/organizations/eng/members", people["owner"]))["items"]
    }
    assert roles == {"olivia": "owner", "ada": "admin", "bob": "member", "aud": "auditor",
                     "mia": "member"}  # fmt: skip
    # The owner may make another owner; the last owner cannot leave.
    olivia = "/api/organizations/eng/members/olivia"
    assert await call(sbx, "DELETE", olivia, ADMIN_KEY) == 409
    assert await call(sbx, "PUT", ada, people["owner"], json={"role": "owner"}) == 200
    assert await call(sbx, "DELETE", olivia, people["admin"]) == 200  # ada is an owner now

    # Every change walked, made or refused, is in the log (a refusal in the caller's own
    # organization's: the outsider's is sales').
    assert (await audited(sbx, org_id="eng", action="member.set"))[-9:] == [
        ("member.set", "olivia", "success", None),
        ("member.set", "ada", "success", None),
        ("member.set", "bob", "failure", 403),
        ("member.set", "aud", "failure", 403),
        ("member.set", "bob", "failure", 403),
        ("member.set", "ada", "failure", 403),
        ("member.set", "ada", "failure", 403),
        ("member.set", "aud", "failure", 403),
        ("member.set", "olivia", "success", None),
    ]
    assert await audited(sbx, org_id="sales", action="member.set", user_id="sam") == [
        ("member.set", "sam", "failure", 404),
    ]

    # An admin of eng reaching sales: 404, however it is asked.
    assert await call(sbx, "GET", "/api/organizations/sales/members", people["admin"]) == 404
    put = await call(sbx, "PUT", "/api/organizations/sales/members/bob", people["admin"],
                     json={"role": "owner"})  # fmt: skip
    assert put == 404
    assert (await audited(sbx, action="member.set", user_id="ada"))[-1] == (
        "member.set",
        "ada",
        "failure",
        404,
    )
    in_sales = {**people["admin"], "X-Org-Id": "sales"}
    assert await call(sbx, "GET", "/api/v1/sandboxes/search", in_sales) == 404
    assert await call(sbx, "GET", "/api/organizations/sales/me", people["admin"]) == 404


async def test_a_user_in_two_organizations_switches(
    sbx: Client, people: dict[str, dict[str, str]]
) -> None:
    await ok(sbx, "PUT", "/api/organizations/sales/members/bob", ADMIN_KEY, json={"role": "admin"})
    bob = people["member"]
    orgs = await ok(sbx, "GET", "/api/organizations", bob)
    assert {(o["id"], o["role"]) for o in orgs["items"]} == {("eng", "member"), ("sales", "admin")}
    assert orgs["current_org_id"] == "eng"  # his key was made in eng
    in_sales = {**bob, "X-Org-Id": "sales"}
    assert (await ok(sbx, "GET", "/api/keys/current", in_sales))["org_id"] == "sales"
    made = await ok(sbx, "POST", "/api/v1/sandboxes", in_sales, json={})
    assert made["org_id"] == "sales"
    # In sales he is an admin: sam's organization's sandboxes are his to list there ...
    assert await call(sbx, "GET", "/api/v1/sandboxes/search?all_users=true", in_sales) == 200
    # ... and not in eng, where he is a member.
    assert await call(sbx, "GET", "/api/v1/sandboxes/search?all_users=true", bob) == 403
    # His own listing follows the organization he acts in.
    eng_own = await ok(sbx, "GET", "/api/v1/sandboxes/search", bob)
    assert made["id"] not in {s["id"] for s in eng_own["items"]}
    # A browser or the CLI switch with the API: it becomes his current organization.
    session = await ok(sbx, "POST", "/api/organizations/sales/switch", bob)
    assert session == {"current_org_id": "sales"}
    assert await call(sbx, "POST", "/api/organizations/nowhere/switch", bob) == 404
    await ok(sbx, "DELETE", f"/api/v1/sandboxes/{made['id']}", in_sales)
