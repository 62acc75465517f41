"""docs/configuration.md lists exactly the configuration the code has, as the code groups it."""

from __future__ import annotations

import pytest

from controlplane.config import (
    GROUPS,
    RUNTIME_SETTINGS,
    SETTING_NAMES,
    ConfigError,
    ServiceConfig,
    load_config,
)
from controlplane.config_reference import PAGE, generated_part, render
from drivers.docker import DockerSettings
from drivers.kubernetes import KubernetesSettings


def test_every_field_has_a_description_and_one_group() -> None:
    grouped = [name for group in GROUPS for name in group.model_fields]
    own = [name for name in ServiceConfig.model_fields if name != "runtime"]
    runtimes = [name for model in RUNTIME_SETTINGS.values() for name in model.model_fields]
    assert sorted(grouped) == sorted(own + runtimes)
    # One variable, one meaning: no runtime's setting shares a name with another's or ours.
    assert len(grouped) == len(set(grouped))
    undescribed = [n for g in GROUPS for n, f in g.model_fields.items() if not f.description]
    assert undescribed == []


def test_the_chosen_runtime_reads_its_own_settings_and_no_other() -> None:
    docker = load_config({"ACS_DOCKER_THREADS": "3", "ACS_KUBE_WORKSPACE_SIZE": "not a size"})
    assert isinstance(docker.runtime, DockerSettings)
    assert docker.runtime.docker_threads == 3  # Kubernetes' settings are not read at all
    kube = load_config(
        {
            "ACS_DRIVER": "kubernetes",
            "ACS_KUBE_WEBHOOK_ADDRESS": "192.0.2.1",
            "ACS_KUBE_WORKSPACE_SIZE": "2Gi",
            "ACS_DOCKER_THREADS": "many",
        }
    )
    assert isinstance(kube.runtime, KubernetesSettings)
    assert kube.runtime.kube_workspace_size == "2Gi"
    with pytest.raises(ConfigError, match=r"^ACS_KUBE_WORKSPACE_SIZE: String should match"):
        load_config({"ACS_DRIVER": "kubernetes", "ACS_KUBE_WORKSPACE_SIZE": "lots"})
    with pytest.raises(ConfigError, match=r"^ACS_DRIVER: 'podman' is none of docker, kubernetes"):
        load_config({"ACS_DRIVER": "podman"})
    # Rules across a runtime's settings and ours are checked at load time too.
    with pytest.raises(ConfigError, match=r"^ACS_CONTAINER_PREFIX: with ACS_DRIVER=kubernetes"):
        load_config(
            {"ACS_DRIVER": "kubernetes", "ACS_KUBE_WEBHOOK_ADDRESS": "192.0.2.1"},
            container_prefix="Upper_",
        )


def test_the_page_lists_exactly_the_fields_of_the_code() -> None:
    assert generated_part(PAGE.read_text()) == render(), (
        "docs/configuration.md is behind controlplane/config.py: run "
        "`.venv/bin/python -m controlplane.config_reference`"
    )
    variables = {f"`ACS_{name.upper()}`" for name in SETTING_NAMES}
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
