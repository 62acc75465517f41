"""Starts that fail, and spec files that stop start-up: real Docker, real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from controlplane.app import create_app
from controlplane.config import ServiceConfig
from controlplane.errors import SpecInvalid
from controlplane.specs.catalog import SpecCatalog, load_spec_file, retag
from drivers.egress import parse_egress
from tests.support.sandbox_helpers import (
    HANGING_SPEC,
    NO_IMAGE_SPEC,
    REPO,
    OwnDocker,
    containers,
    spec_dir,
    volumes,
    wait_status,
)
from tests.support.types import Client, UserHeaders

# A sandbox that does not answer /health fails in 3 s, not a minute.
pytestmark = pytest.mark.sbx_specs(
    {"hanging": HANGING_SPEC, "no-image": NO_IMAGE_SPEC}, start_timeout=3
)


async def start_spec(client: Client, headers: dict[str, str], spec: str) -> dict[str, Any]:
    resp = await client.post("/api/v1/sandboxes", json={"sandbox_spec_id": spec}, headers=headers)
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    assert body["status"] == "STARTING"
    assert body["sandbox_spec_id"] == spec
    return body


async def wait_gone(docker_client: docker.DockerClient, prefix: str, within: float = 10) -> None:
    """Poll until no container and no volume of `prefix` exists."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [c.name for c in containers(docker_client, prefix)]
        left += [v.name for v in volumes(docker_client, prefix)]
        if not left:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still there after {within}s: {left}")


async def test_hanging_agent_cannot_be_paused_and_ends_in_error_cleaned_up(
    sbx_with_specs: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    sandbox_id = (await start_spec(sbx_with_specs, alice, "hanging"))["id"]

    # The container comes up but its agent never answers: the sandbox stays STARTING.
    deadline = time.monotonic() + 10
    while not own_docker.containers():
        assert time.monotonic() < deadline, "the hanging sandbox's container never appeared"
        await asyncio.sleep(0.05)
    resp = await sbx_with_specs.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
    body = await resp.json()
    assert resp.status == 409, body
    assert "STARTING" in body["detail"]
    assert sandbox_id in body["detail"]

    failed = await wait_status(sbx_with_specs, alice, sandbox_id, "ERROR", within=20)
    assert "/health" in failed["reason"], failed
    assert failed["reason"].startswith("start failed:"), failed
    assert failed["session_api_key"] is None
    assert failed["exposed_urls"] is None
    # A failed first start removes everything it made.
    assert own_docker.containers() == []
    assert own_docker.volumes() == []

    # ERROR is not a dead end: resume tries again (here it hangs again, and fails again).
    resp = await sbx_with_specs.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert (resp.status, await resp.json()) == (200, {"success": True})
    again = await (
        await sbx_with_specs.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    ).json()
    assert again["status"] == "STARTING", again
    again = await wait_status(sbx_with_specs, alice, sandbox_id, "ERROR", within=20)
    assert "/health" in again["reason"], again
    resp = await sbx_with_specs.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert (resp.status, await resp.json()) == (200, {"success": True})
    resp = await sbx_with_specs.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 404
    search = await (await sbx_with_specs.get("/api/v1/sandboxes/search", headers=alice)).json()
    assert search == {"items": [], "next_page_id": None}


async def test_missing_image_is_error_naming_the_image_with_nothing_left(
    sbx_with_specs: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    alice = await user_headers("alice")
    sandbox_id = (await start_spec(sbx_with_specs, alice, "no-image"))["id"]
    failed = await wait_status(sbx_with_specs, alice, sandbox_id, "ERROR", within=15)
    assert "acs-no-such-image:latest" in failed["reason"], failed
    assert "make images" in failed["reason"], failed
    assert own_docker.containers() == []
    assert own_docker.volumes() == []

    resp = await sbx_with_specs.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
    assert resp.status == 409
    # A resume tries again, and fails again for the same reason: no half-made container.
    resp = await sbx_with_specs.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200
    again = await wait_status(sbx_with_specs, alice, sandbox_id, "ERROR", within=15)
    assert "make images" in again["reason"], again
    assert own_docker.containers() == []
    resp = await sbx_with_specs.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 200
    resp = await sbx_with_specs.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
    assert resp.status == 404


async def test_delete_while_starting_leaves_nothing_behind(
    sbx_with_specs: Client,
    user_headers: UserHeaders,
    own_docker: OwnDocker,
) -> None:
    """A delete that lands while the engine is still creating the container must still win."""
    alice = await user_headers("alice")
    for _ in range(3):
        sandbox_id = (await start_spec(sbx_with_specs, alice, "hanging"))["id"]
        resp = await sbx_with_specs.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
        assert (resp.status, await resp.json()) == (200, {"success": True})
        resp = await sbx_with_specs.get(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)
        assert resp.status == 404
    # Give a container created late (after the delete's removal) time to show up.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert own_docker.containers() == []
        assert own_docker.volumes() == []
        await asyncio.sleep(0.2)
    search = await (await sbx_with_specs.get("/api/v1/sandboxes/search", headers=alice)).json()
    assert search["items"] == []


# -- spec files that stop start-up --------------------------------------------------------------

GOOD = """\
id: broken
image: acs-sandbox-default:latest
exposed_ports:
  AGENT_SERVER: 8000
resources:
  cpus: 0.5
  memory: 64m
"""


@pytest.mark.parametrize(
    "case",
    [
        (GOOD.replace("image:", "colour: red\nimage:"), 2, "colour", "Extra inputs"),
        (GOOD.replace("AGENT_SERVER", "WEB"), 3, "exposed_ports", "AGENT_SERVER"),
        (GOOD.replace("memory: 64m", "memory: lots"), 7, "resources.memory", "512m"),
        (GOOD.replace("memory: 64m", "memory: 1m"), 7, "resources.memory", "at least 6m"),
        (GOOD.replace("id: broken", "id: Broken Spec"), 1, "id", "pattern"),
        (GOOD.replace("  cpus: 0.5", "  cpus: -1"), 6, "resources.cpus", "greater than 0"),
        (GOOD.replace("image: acs", "image:\n  - acs"), 2, "image", "string"),
        (GOOD + "working_dir: relative/path\n", 8, "working_dir", "absolute"),
    ],
    ids=[
        "unknown-key",
        "no-agent-server",
        "bad-memory",
        "tiny-memory",
        "bad-id",
        "bad-cpus",
        "image-list",
        "relative-dir",
    ],
)
def test_bad_spec_file_stops_start_up_naming_file_line_field(
    tmp_path: Path, make_config: Callable[..., ServiceConfig], case: tuple[str, int, str, str]
) -> None:
    text, line, field, words = case
    directory = spec_dir(tmp_path, {"broken": text})
    bad = directory / "broken.yaml"
    with pytest.raises(SpecInvalid) as caught:
        SpecCatalog.load(directory)
    message = str(caught.value)
    assert message.startswith(f"{bad}:{line}: {field}: "), message
    assert words in message, message
    with pytest.raises(SpecInvalid) as again:
        create_app(make_config(spec_dir=directory), with_sandboxes=True)
    assert str(again.value) == message


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    directory = spec_dir(tmp_path, {"broken": GOOD.replace("  cpus: 0.5", "  cpus: [0.5")})
    with pytest.raises(SpecInvalid) as caught:
        SpecCatalog.load(directory)
    message = str(caught.value)
    assert message.startswith(f"{directory / 'broken.yaml'}:"), message
    assert "not valid YAML" in message


def test_two_default_specs_stop_start_up(
    tmp_path: Path, make_config: Callable[..., ServiceConfig]
) -> None:
    second = (REPO / "specs" / "default.yaml").read_text().replace("id: default", "id: other")
    directory = spec_dir(tmp_path, {"other": second})
    with pytest.raises(SpecInvalid) as caught:
        create_app(make_config(spec_dir=directory), with_sandboxes=True)
    message = str(caught.value)
    assert "exactly one spec must have default: true" in message
    assert "default, other" in message


def test_no_default_spec_and_duplicate_ids_stop_start_up(tmp_path: Path) -> None:
    directory = spec_dir(tmp_path, {})
    default = directory / "default.yaml"
    default.write_text(default.read_text().replace("default: true", "default: false"))
    with pytest.raises(SpecInvalid, match=r"exactly one spec must have default: true \(found: "):
        SpecCatalog.load(directory)
    (directory / "copy.yaml").write_text(default.read_text())
    with pytest.raises(SpecInvalid, match="two spec files use the same id"):
        SpecCatalog.load(directory)


def test_spec_dir_missing_or_empty(tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="is not a directory"):
        SpecCatalog.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecInvalid, match=r"no \*\.yaml spec files"):
        SpecCatalog.load(tmp_path / "empty")


def test_image_tag_replaces_the_tag_of_built_images_only(tmp_path: Path) -> None:
    directory = spec_dir(tmp_path, {"prebuilt": GOOD.replace("id: broken", "id: prebuilt")})
    catalog = SpecCatalog.load(directory, image_tag="wt-1")
    assert catalog.get("default").image == "acs-sandbox-default:wt-1"
    assert catalog.get("prebuilt").image == "acs-sandbox-default:latest"  # no build: section
    assert retag("registry:5000/team/img:1.0", "x") == "registry:5000/team/img:x"
    assert retag("img", "x") == "img:x"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("egress", "'somewhere'", "egress"),
        ("egress", "[]", "write `egress: none`"),
        ("egress", "['example.com']", "is not host:port"),
        ("egress", "['example.com:0']", "the port must be a number from 1 to 65535"),
        ("egress", "['169.254.169.254:80']", "link-local, loopback and multicast"),
        ("egress", "['[::1]:80']", "IPv6 is not supported"),
        ("egress", "['exa mple.com:80']", "neither an IPv4 address, a CIDR nor a DNS name"),
        ("tmpfs", "{tmp: size=1m}", "must be an absolute path"),
        ("tmpfs", "{/tmp: 'size=1m;rm -rf'}", "are not mount options"),
        ("user", "'root; id'", "user"),
        ("runtime", "'run sc'", "runtime"),
    ],
)
def test_isolation_fields_are_validated(
    tmp_path: Path, field: str, value: str, reason: str
) -> None:
    (tmp_path / "bad.yaml").write_text(
        f"id: bad\nimage: x:1\nexposed_ports: {{AGENT_SERVER: 8000}}\n{field}: {value}\n"
    )
    with pytest.raises(SpecInvalid) as caught:
        load_spec_file(tmp_path / "bad.yaml")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:4: {field}"), message
    assert reason in message, message


def test_isolation_fields_parse(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(
        "id: ok\nimage: x:1\nexposed_ports: {AGENT_SERVER: 8000}\nread_only_root: true\n"
        "runtime: runsc\negress: [203.0.113.7:443, 10.1.0.0/16:5432, pypi.org:443,"
        " host.docker.internal:11434]\n"
    )
    spec = load_spec_file(tmp_path / "ok.yaml")
    assert spec.user == "1000:1000"
    assert set(spec.tmpfs_mounts) == {"/tmp", "/home/agent", "/var/lib/acs-agent"}
    assert spec.runtime == "runsc"
    destinations = parse_egress(spec.egress)
    assert destinations is not None
    assert [(str(d.network) if d.network else d.name, d.port) for d in destinations] == [
        ("203.0.113.7/32", 443),
        ("10.1.0.0/16", 5432),
        ("pypi.org", 443),
        ("host.docker.internal", 11434),
    ]
    assert destinations[-1].is_host
