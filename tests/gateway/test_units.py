"""The LLM gateway's pure parts: what an agent's start request holds instead of the key, which
provider a model goes to, which models a credential may name, which addresses the gateway may
call, and that a sandbox token holds only as issued."""

from __future__ import annotations

import socket

import pytest
from cryptography.fernet import Fernet

from controlplane.crypto import SecretBox
from controlplane.gateway.agent_llm import agent_llm
from controlplane.gateway.credentials import SandboxTokens, UserGatewayKeys
from controlplane.gateway.metering import cost_of
from controlplane.gateway.upstream import OPENAI_BASE_URL, UpstreamError, matches, resolve
from controlplane.outbound.policy import DestinationRefused, OutboundPolicy, Rules
from controlplane.specs.models import SandboxSpec

KEY = "sk-unit-SECRET-5d1c"
SID, CID = "01a2" + "0" * 28, "0b" * 16


def spec(**fields: object) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"id": "s", "image": "x", "exposed_ports": {"AGENT_SERVER": 8000}, **fields}
    )


def tokens() -> SandboxTokens:
    return SandboxTokens(SecretBox(Fernet.generate_key()))


@pytest.mark.parametrize(
    ("kind", "model", "sent"),
    [("acs", "anthropic/claude-x", "anthropic/claude-x"), ("openhands", "m", "openai/m")],
)
def test_agents_get_the_gateway_and_a_token_never_the_key(kind: str, model: str, sent: str) -> None:
    issued = tokens()
    llm = agent_llm(
        spec=spec(agent_kind=kind),
        model=model,
        base_url="https://provider.test/v1",
        api_key=KEY,
        prices=(0.1, 0.2),
        tokens=issued,
        control_plane_url="http://host.docker.internal:3000/",
        sandbox_id=SID,
        conversation_id=CID,
        user_id="alice",
    )
    assert KEY not in str(llm)
    assert "provider.test" not in str(llm)
    assert llm["model"] == sent
    assert llm["base_url"] == "http://host.docker.internal:3000/api/v1/llm-gateway/v1"
    assert issued.parse(llm["api_key"]) is not None
    assert (llm["input_cost_per_token"], llm["output_cost_per_token"]) == (0.1, 0.2)
    assert ("api_mode" in llm) == (kind == "openhands")


def test_a_spec_that_opts_out_gets_the_key() -> None:
    llm = agent_llm(
        spec=spec(llm_gateway=False),
        model="m",
        base_url="https://provider.test/v1",
        api_key=KEY,
        prices=(None, None),
        tokens=tokens(),
        control_plane_url="http://cp",
        sandbox_id=SID,
        conversation_id=CID,
        user_id="alice",
    )
    assert (llm["api_key"], llm["base_url"], llm["model"]) == (KEY, "https://provider.test/v1", "m")


@pytest.mark.parametrize(
    ("model", "base", "via", "upstream_model", "url"),
    [
        ("openai/gpt-4o", None, "direct", "gpt-4o", OPENAI_BASE_URL),
        ("openai/m", "http://vllm:8000/v1/", "direct", "m", "http://vllm:8000/v1"),
        ("litellm_proxy/claude", "http://proxy:4000", "direct", "claude", "http://proxy:4000"),
        ("local-model", "http://llama:8080/v1", "direct", "local-model", "http://llama:8080/v1"),
        ("anthropic/claude-x", None, "translator", "anthropic/claude-x", None),
        ("gemini/gemini-2.0", None, "translator", "gemini/gemini-2.0", None),
        ("openrouter/a/b", None, "translator", "openrouter/a/b", None),
        (
            "ollama/llama3",
            "http://ollama:11434",
            "translator",
            "ollama/llama3",
            "http://ollama:11434",
        ),
        ("gpt-4o", None, "translator", "gpt-4o", None),
    ],
)
def test_models_go_to_their_provider(
    model: str, base: str | None, via: str, upstream_model: str, url: str | None
) -> None:
    upstream = resolve(model, base, "k")
    assert (upstream.via, upstream.model, upstream.base_url) == (via, upstream_model, url)


def test_without_direct_everything_is_translated() -> None:
    upstream = resolve("local-model", "http://llama:8080/v1", "k", direct=False)
    assert (upstream.via, upstream.model) == ("translator", "openai/local-model")
    assert resolve("openai/gpt-4o", None, "k", direct=False).via == "translator"
    with pytest.raises(UpstreamError):
        resolve("litellm_proxy/x", None, "k")


@pytest.mark.parametrize(
    ("requested", "configured", "ok"),
    [
        ("fake-model", "fake-model", True),
        ("openai/fake-model", "fake-model", True),
        ("litellm_proxy/anthropic/claude", "anthropic/claude", True),
        ("claude", "anthropic/claude", True),  # as the provider knows it
        ("openai/fake-model", "openai/fake-model", True),
        ("gpt-4o", "fake-model", False),
        ("anthropic/other", "anthropic/claude", False),
        ("openai/gpt-4o", "openai/fake-model", False),
    ],
)
def test_a_credential_names_its_own_model_only(requested: str, configured: str, ok: bool) -> None:
    assert matches(requested, configured) is ok


def local_address() -> str:
    """A non-loopback address of this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks a source address
        return str(probe.getsockname()[0])


def test_the_gateway_calls_no_host_service_and_no_metadata_address() -> None:
    def check_address(address: str, port: int, host_ports: list[int]) -> None:
        OutboundPolicy(Rules(host_ports=frozenset(host_ports))).check(address, port)

    for address in ("169.254.169.254", "224.0.0.1", "0.0.0.0", "::", "fe80::1"):  # noqa: S104
        with pytest.raises(DestinationRefused):
            check_address(address, 80, [])
    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1", local_address()):
        with pytest.raises(DestinationRefused):
            check_address(address, 6379, [11434])
        check_address(address, 11434, [11434])  # a model server on an allowed host port
    check_address("93.184.216.34", 443, [])  # the internet
    with pytest.raises(DestinationRefused):
        check_address("192.0.2.55", 8000, [])  # the LAN: only what ACS_OUTBOUND_ALLOW admits


def test_a_token_holds_only_as_issued() -> None:
    issued = tokens()
    token = issued.issue(SID, CID, "alice@example.com")
    claim = issued.parse(token)
    assert claim is not None
    assert (claim.sandbox_id, claim.conversation_id, claim.user_id) == (
        SID,
        CID,
        "alice@example.com",
    )
    head, conversation, sandbox, user, mac = token.split(".")
    bob = SandboxTokens.__new__(SandboxTokens)
    bob._key = b"another deployment's key"
    forged = bob.issue(SID, CID, "alice@example.com")
    for edited in (
        f"{head}.{'0c' * 16}.{sandbox}.{user}.{mac}",  # another conversation
        f"{head}.{conversation}.{'0' * 32}.{user}.{mac}",  # another sandbox
        f"{head}.{conversation}.{sandbox}.Ym9i.{mac}",  # another user (bob)
        f"{head}.{conversation}.{sandbox}.{user}.{'A' * 43}",
        forged,
        token + "x",
    ):
        assert issued.parse(edited) is None, edited
    key = "acs-llm.YWxpY2U.0123456789ab." + "x" * 43
    parsed = UserGatewayKeys.parse(key)
    assert parsed is not None
    assert (parsed.user_id, parsed.key_id) == ("alice", "0123456789ab")
    assert UserGatewayKeys.parse("acs-llm.!!.0123456789ab." + "x" * 43) is None


def test_cost_is_priced_by_the_model_then_without_its_prefix() -> None:
    prices = {"fake-model": (0.001, 0.002)}
    assert cost_of(prices, "openai/fake-model", 100, 20).cost == pytest.approx(0.14)
    unpriced = cost_of(prices, "anthropic/claude", 100, 20)
    assert (unpriced.cost, unpriced.priced) == (0.0, False)
    assert cost_of(prices, "anthropic/claude", 100, 20, fallback=0.5).cost == 0.5
