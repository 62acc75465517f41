"""The settings fields of the spec (table 2.1), for the settings, v1 settings and OpenAPI tests."""

from __future__ import annotations

from typing import Any

# Spec table 2.1: field -> (allowed JSON types of the value, default on a fresh user).
NULL = type(None)
SPEC_FIELDS: dict[str, tuple[tuple[type, ...], Any]] = {
    "llm_api_key_set": ((bool,), False),
    "language": ((str, NULL), None),
    "agent": ((str, NULL), None),
    "max_iterations": ((int, NULL), None),
    "security_analyzer": ((str, NULL), None),
    "confirmation_mode": ((bool, NULL), None),
    "llm_model": ((str, NULL), None),
    "llm_api_key": ((str, NULL), None),
    "llm_base_url": ((str, NULL), None),
    "remote_runtime_resource_factor": ((int, NULL), None),
    "secrets_store": ((dict,), {"provider_tokens": {}, "custom_secrets": {}}),
    "enable_default_condenser": ((bool,), True),
    "enable_sound_notifications": ((bool,), False),
    "enable_proactive_conversation_starters": ((bool,), True),
    "enable_solvability_analysis": ((bool,), True),
    "user_consents_to_analytics": ((bool, NULL), None),
    "sandbox_base_container_image": ((str, NULL), None),
    "sandbox_runtime_container_image": ((str, NULL), None),
    "mcp_config": ((dict, NULL), None),
    "search_api_key": ((str, NULL), None),
    "sandbox_api_key": ((str, NULL), None),
    "max_budget_per_task": ((int, float, NULL), None),
    "email": ((str, NULL), None),
    "email_verified": ((bool, NULL), None),
    "git_user_name": ((str, NULL), None),
    "git_user_email": ((str, NULL), None),
    "provider_tokens_set": ((dict,), {}),
    "search_api_key_set": ((bool,), False),
}
SECRET_FIELDS = ("llm_api_key", "search_api_key", "sandbox_api_key")

# A non-default value for every writable, non-secret field.
EVERY_FIELD: dict[str, Any] = {
    "language": "de",
    "agent": "CodeActAgent",
    "max_iterations": 250,
    "security_analyzer": "llm",
    "confirmation_mode": True,
    "llm_model": "anthropic/claude-sonnet-4",
    "llm_base_url": "https://llm.example.com/v1",
    "remote_runtime_resource_factor": 4,
    "enable_default_condenser": False,
    "enable_sound_notifications": True,
    "enable_proactive_conversation_starters": False,
    "enable_solvability_analysis": False,
    "user_consents_to_analytics": False,
    "sandbox_base_container_image": "python:3.12-bookworm",
    "sandbox_runtime_container_image": "acs-runtime:1",
    "mcp_config": {
        "sse_servers": [{"url": "https://sse.example.com/mcp", "api_key": None}],
        "stdio_servers": [{"name": "fs", "command": "npx", "args": ["-y", "fs"], "env": {}}],
        "shttp_servers": [{"url": "https://shttp.example.com/mcp", "api_key": None, "timeout": 30}],
    },
    "max_budget_per_task": 12.5,
    "condenser_max_size": 120,
    "email": "ada@example.com",
    "email_verified": True,
    "git_user_name": "Ada Lovelace",
    "git_user_email": "ada@example.org",
    "v1_enabled": True,
}
