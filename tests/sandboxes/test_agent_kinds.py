"""Agent kinds in specs: the `agent_kind` and `enabled` fields, ACS_ENABLE_SPECS, the container
environment the launcher gives the official agent server, and the budget rule the control plane
applies for it (the end-to-end proof is tests/clients/test_official_agent.py)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.agent_protocol.kinds import max_batch_bytes
from controlplane.agent_protocol.models import MetricsSnapshot
from controlplane.agent_protocol.start_request import mcp_servers
from controlplane.config import ServiceConfig, load_config
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.errors import SpecInvalid
from controlplane.events.budget import budget_error_event, crossed
from controlplane.sandboxes.launcher import sandbox_request
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.settings.mcp import MCPConfig
from controlplane.specs.catalog import SpecCatalog
from tests.conftest import REPO
from tests.support.records import NO_ENGINE, event, sandbox_record, stats
from tests.support.sandbox_helpers import spec_dir
from tests.support.types import Client

SPECS = REPO / "specs"


def test_the_openhands_spec_is_offered_only_when_enabled() -> None:
    assert SpecCatalog.load(SPECS).find("openhands") is None
    catalog = SpecCatalog.load(SPECS, enable=["openhands"])
    spec = catalog.get("openhands")
    assert spec.agent_kind == "openhands"
    assert catalog.default.id == "default"
    assert catalog.default.agent_kind == "acs"
    assert spec.build is not None
    assert (spec.build.debian, spec.build.python) == ("trixie", "3.13")
    assert catalog.info(spec).agent_kind == "openhands"
    with pytest.raises(SpecInvalid, match="ACS_ENABLE_SPECS: no spec file has the id 'nope'"):
        SpecCatalog.load(SPECS, enable=["nope"])


def test_enable_specs_is_a_comma_separated_setting() -> None:
    config = load_config({"ACS_ENABLE_SPECS": " openhands, python-dev ,"})
    assert config.enable_specs == ["openhands", "python-dev"]


def test_openhands_options_need_the_openhands_kind(tmp_path: Path) -> None:
    bad = "id: x\nimage: x:1\nexposed_ports: {AGENT_SERVER: 8000}\nopenhands: {vscode: true}\n"
    with pytest.raises(SpecInvalid, match="openhands options need agent_kind: openhands"):
        SpecCatalog.load(spec_dir(tmp_path, {"x": bad}))
    unknown = "id: y\nimage: y:1\nexposed_ports: {AGENT_SERVER: 8000}\nagent_kind: claude\n"
    (tmp_path / "2").mkdir()
    with pytest.raises(SpecInvalid, match=r"y\.yaml:4: agent_kind: Input should be 'acs'"):
        SpecCatalog.load(spec_dir(tmp_path / "2", {"y": unknown}))


def test_the_official_server_gets_its_environment(
    make_config: Callable[..., ServiceConfig],
) -> None:
    catalog = SpecCatalog.load(SPECS, enable=["openhands"])
    record = sandbox_record("alice", SandboxStatus.STARTING)
    config = make_config()
    env = sandbox_request(
        config, record, catalog.get("openhands"), "http://host.docker.internal:8123"
    ).env
    assert env["OH_WEBHOOKS_0_BASE_URL"].endswith(f":8123/api/v1/webhooks/{record.id}")
    assert env["TZ"] == "UTC"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["OH_ENABLE_VSCODE"] == env["OH_ENABLE_BROWSER"] == "false"
    assert env["OH_PRELOAD_TOOLS"] == "false"
    assert env["OH_CONVERSATIONS_PATH"].startswith("/var/lib/acs-agent/")
    # No event dropped: a short flush, ten minutes of retries, batches under our body limit.
    assert float(env["OH_WEBHOOKS_0_FLUSH_DELAY"]) <= 0.1
    retrying = int(env["OH_WEBHOOKS_0_NUM_RETRIES"]) * int(env["OH_WEBHOOKS_0_RETRY_DELAY"])
    assert retrying >= 600
    assert int(env["OH_WEBHOOKS_0_MAX_BATCH_BYTES"]) * 3 < config.max_body_bytes
    assert env["OH_SESSION_API_KEYS_0"] == record.session_api_key

    # Ours needs none of it; without a webhook there is nothing to tune.
    ours = sandbox_request(config, record, catalog.default, "http://host.docker.internal:8123").env
    assert not any(k.startswith(("OH_WEBHOOKS_0_FLUSH", "OH_ENABLE", "TZ")) for k in ours)
    quiet = sandbox_request(config, record, catalog.get("openhands")).env
    assert not any(k.startswith("OH_WEBHOOKS_0_") for k in quiet)


def test_spec_options_and_initial_env_reach_the_official_server(
    tmp_path: Path, make_config: Callable[..., ServiceConfig]
) -> None:
    text = (SPECS / "openhands.yaml").read_text()
    text += "openhands: {vscode: true, browser: true}\n"
    text = text.replace("initial_env: {}", "initial_env: {OH_WEBHOOKS_0_FLUSH_DELAY: '1.5'}")
    catalog = SpecCatalog.load(spec_dir(tmp_path, {"openhands": text}), enable=["openhands"])
    record = sandbox_record("alice", SandboxStatus.STARTING)
    env = sandbox_request(
        make_config(), record, catalog.get("openhands"), "http://host.docker.internal:1"
    ).env
    assert env["OH_ENABLE_VSCODE"] == env["OH_ENABLE_BROWSER"] == env["OH_PRELOAD_TOOLS"] == "true"
    assert env["OH_WEBHOOKS_0_FLUSH_DELAY"] == "1.5"  # the operator's file wins


def test_a_batch_the_server_sizes_stays_under_the_body_limit() -> None:
    """The server counts compact UTF-8; it sends ASCII-escaped JSON with spaces."""
    limit = 1024 * 1024
    budget = max_batch_bytes(limit)
    event = {"kind": "MessageEvent", "text": "\U0001f600" * 1000}
    compact = len(json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode())
    batch = [event] * (budget // compact)
    assert len(json.dumps(batch).encode()) < limit


def test_the_budget_rule() -> None:
    spent = MetricsSnapshot(accumulated_cost=0.3)
    assert crossed(None, spent, 0.2)
    assert crossed(MetricsSnapshot(accumulated_cost=0.25), spent, 0.2)  # another call over it
    assert not crossed(spent, spent, 0.2)  # the same cost again: already handled
    assert not crossed(None, spent, None)
    assert not crossed(None, spent, 0.3)  # at the budget is within it
    event = budget_error_event(0.3, 0.2)
    assert (event["kind"], event["code"], event["source"]) == (
        "ConversationErrorEvent",
        "BudgetExceeded",
        "environment",
    )
    assert "$0.300000" in event["detail"]


def test_make_images_builds_only_enabled_specs(tmp_path: Path) -> None:
    """The build script's spec listing, as `make images` uses it (no Docker involved)."""
    env = {**os.environ, "ACS_DATA_DIR": str(tmp_path)}
    script = REPO / "scripts" / "build-images.sh"
    listing = subprocess.run(
        [
            "bash",
            "-c",
            f'source <(sed -n "/^list_buildable_specs()/,/^}}/p" {script}); '
            "yaml_python() { echo .venv/bin/python; }; list_buildable_specs",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {line.split("\t")[1]: line.split("\t") for line in listing.splitlines()}
    assert rows["openhands"][4:] == [
        "trixie",
        "3.13",
        "specs/images/openhands/requirements.lock",
        "0",
        "openhands",
    ]
    assert rows["default"][4:] == ["bookworm", "3.11", "-", "1", "acs"]


def test_mcp_servers_in_the_shape_each_agent_kind_reads() -> None:
    config = MCPConfig.model_validate(
        {
            "stdio_servers": [{"name": "fs", "command": "npx", "args": ["fs"], "env": {"A": "b"}}],
            "shttp_servers": [{"url": "https://mcp.example.com/mcp", "api_key": "k2"}],
        }
    )
    ours = mcp_servers(config)
    assert ours["mcpServers"]["shttp-0"]["auth"] == "k2"
    official = mcp_servers(config, "openhands")
    assert "mcpServers" not in official  # 1.58: agent.mcp_config is {name: MCPServer}
    assert official["fs"] == {"command": "npx", "args": ["fs"], "env": {"A": "b"}}
    assert official["shttp-0"]["auth"] == {"strategy": "bearer", "value": "k2"}
    assert mcp_servers(MCPConfig(), "openhands") == {}


async def test_a_late_conversation_info_of_the_official_server_changes_nothing_newer(
    make_client: Callable[..., Awaitable[Client]],
    raw_redis: aioredis.Redis,
    user_headers: Callable[..., Awaitable[dict[str, str]]],
) -> None:
    """It posts each ConversationInfo from a task of its own: an older one can land last."""
    client = await make_client(
        with_sandboxes=True, docker_url=NO_ENGINE, enable_specs=["openhands"]
    )
    key = secrets.token_urlsafe(32)
    record = sandbox_record("alice", SandboxStatus.RUNNING, key).model_copy(
        update={"spec_id": "openhands"}
    )
    assert await SandboxStore(raw_redis, client.app[keys.SECRET_BOX]).create(record, 0, Limits())
    cid = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=cid, created_by_user_id="alice", sandbox_id=record.id)
    )
    sandbox, alice = {"X-Session-API-Key": key}, await user_headers("alice")
    base = f"/api/v1/webhooks/{record.id}"

    async def conversation() -> dict[str, Any]:
        resp = await client.get(f"/api/v1/app-conversations/{cid}", headers=alice)
        body: dict[str, Any] = await resp.json()
        return body

    first = {"id": cid, "execution_status": "idle", "stats": stats(0.0, 0, 0)}
    assert (await client.post(f"{base}/conversations", json=first, headers=sandbox)).status == 200
    assert (await conversation())["execution_status"] == "idle"  # nothing known before it
    done = [
        event("ConversationStateUpdateEvent", key="stats", value=stats(0.3, 300, 30)),
        event("ConversationStateUpdateEvent", key="execution_status", value="finished"),
    ]
    assert (await client.post(f"{base}/events/{cid}", json=done, headers=sandbox)).status == 200
    late = {"id": cid, "execution_status": "running", "stats": stats(0.1, 100, 10)}
    assert (await client.post(f"{base}/conversations", json=late, headers=sandbox)).status == 200
    after = await conversation()
    assert after["execution_status"] == "finished"
    assert after["metrics"]["accumulated_cost"] == 0.3
