"""docs/configuration.md lists exactly the configuration the code has, as the code groups it."""

from __future__ import annotations

from controlplane.config import GROUPS, ServiceConfig, load_config
from controlplane.config_reference import PAGE, generated_part, render


def test_every_field_has_a_description_and_one_group() -> None:
    grouped = [name for group in GROUPS for name in group.model_fields]
    assert sorted(grouped) == sorted(ServiceConfig.model_fields)
    assert len(grouped) == len(set(grouped))
    undescribed = [n for n, f in ServiceConfig.model_fields.items() if not f.description]
    assert undescribed == []


def test_the_page_lists_exactly_the_fields_of_the_code() -> None:
    assert generated_part(PAGE.read_text()) == render(), (
        "docs/configuration.md is behind controlplane/config.py: run "
        "`.venv/bin/python -m controlplane.config_reference`"
    )
    variables = {f"`ACS_{name.upper()}`" for name in ServiceConfig.model_fields}
    listed = {
        line.split("|")[1].strip()
        for line in generated_part(PAGE.read_text()).splitlines()
        if line.startswith("| `ACS_")
    }
    assert listed == variables


def test_every_list_variable_takes_comma_separated_items() -> None:
    config = load_config(
        {
            "ACS_CORS_ORIGINS": "https://a.example, http://b.example:8080,",
            "ACS_ENABLE_SPECS": "openhands ,x",
            "ACS_LIFECYCLE_WEBHOOK_URLS": "http://h1/a,https://h2/b",
            "ACS_LLM_MODELS": "openai/gpt-4o, anthropic/claude",
            "ACS_SANDBOX_HOST_PORTS": "11434, 8080,11434",
        }
    )
    assert config.cors_origins == ["https://a.example", "http://b.example:8080"]
    assert config.enable_specs == ["openhands", "x"]
    assert config.lifecycle_webhook_urls == ["http://h1/a", "https://h2/b"]
    assert config.llm_models == ["openai/gpt-4o", "anthropic/claude"]
    assert config.sandbox_host_ports == [8080, 11434]
