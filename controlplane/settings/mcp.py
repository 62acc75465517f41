"""MCPConfig (spec 2.2) with the validation rules OpenHands clients already expect."""

from __future__ import annotations

import re
import shlex
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MASK = "**********"
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_ENV_KEY_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


URL_PATTERN = r"^\s*(?:[hH][tT][tT][pP][sS]?|[wW][sS][sS]?)://[^/?#\s\[\]]+(?:[/?#]\S*)?\s*$"
"""What _check_url accepts, as the OpenAPI document states it (the validator explains why not)."""


def _check_url(value: str) -> str:
    url = value.strip()
    if not url:
        raise ValueError("URL cannot be empty")
    parsed = urlparse(url)
    if not parsed.scheme:
        raise ValueError("URL must include a scheme (http:// or https://)")
    if not parsed.netloc:
        raise ValueError("URL must include a valid domain/host")
    if parsed.scheme not in ("http", "https", "ws", "wss"):
        raise ValueError("URL scheme must be http, https, ws, or wss")
    return url


class MCPSSEServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, json_schema_extra={"pattern": URL_PATTERN})
    api_key: str | None = Field(default=None, max_length=4096)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)


class MCPSHTTPServer(MCPSSEServer):
    timeout: int | None = Field(default=60, json_schema_extra={"minimum": 1, "maximum": 3600})

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("Timeout must be positive")
        if value is not None and value > 3600:
            raise ValueError("Timeout cannot exceed 3600 seconds")
        return value


MAX_LINE = 65536


def _or_string(schema: dict[str, Any], pattern: str) -> None:
    # Also a string (args split like a shell line, env as KEY=VALUE,...), as OpenHands takes them;
    # the pattern is the part of such strings that always parses (no quotes to balance).
    typed = {k: schema.pop(k) for k in list(schema) if k not in ("title", "description")}
    schema["anyOf"] = [typed, {"type": "string", "maxLength": MAX_LINE, "pattern": pattern}]


def _args_schema(schema: dict[str, Any]) -> None:
    _or_string(schema, r"^[^\"'\\]*$")


_PAIR = r"[A-Za-z_][A-Za-z0-9_]*=[^,]*"


def _env_schema(schema: dict[str, Any]) -> None:
    schema["propertyNames"] = {"pattern": _ENV_KEY_RE.pattern}
    _or_string(schema, rf"^(?:{_PAIR}(?:,{_PAIR})*)?$")


class MCPStdioServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The patterns state in the OpenAPI document what the validators below accept (a little
    # stricter: no surrounding blanks); the validators keep their explaining messages.
    name: str = Field(max_length=64, json_schema_extra={"pattern": _NAME_RE.pattern})
    command: str = Field(max_length=1024, json_schema_extra={"pattern": r"^\S+$"})
    args: list[str] = Field(default_factory=list, max_length=256, json_schema_extra=_args_schema)
    env: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra=_env_schema,
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("Server name cannot be empty")
        if not _NAME_RE.match(value):
            raise ValueError(
                "Server name can only contain letters, numbers, hyphens, and underscores"
            )
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("Command cannot be empty")
        if " " in value:
            raise ValueError(
                "Command should be a single executable without spaces "
                "(use arguments field for parameters)"
            )
        return value

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > MAX_LINE:
            raise ValueError(f"args as one string may hold at most {MAX_LINE} characters")
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"Invalid argument format: {exc}") from None
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > MAX_LINE:
            raise ValueError(f"env as one string may hold at most {MAX_LINE} characters")
        if isinstance(value, str):
            pairs: dict[str, str] = {}
            for pair in filter(None, (p.strip() for p in value.split(","))):
                if "=" not in pair:
                    raise ValueError(f"Environment variable '{pair}' must be in KEY=VALUE format")
                key, _, val = pair.partition("=")
                pairs[key.strip()] = val
            value = pairs
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str) or not key:
                    raise ValueError("Environment variable key cannot be empty")
                if not _ENV_KEY_RE.match(key):
                    raise ValueError(
                        f"Invalid environment variable name '{key}'. Must start with letter or "
                        "underscore, contain only alphanumeric characters and underscores"
                    )
        return value


class MCPConfig(BaseModel):
    """Tool servers: stdio ones run inside the sandbox, sse/shttp ones are reached from it."""

    model_config = ConfigDict(extra="forbid")

    sse_servers: list[MCPSSEServer] = Field(default_factory=list, max_length=64)
    stdio_servers: list[MCPStdioServer] = Field(default_factory=list, max_length=64)
    shttp_servers: list[MCPSHTTPServer] = Field(default_factory=list, max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _plain_urls(cls, data: Any) -> Any:
        # OpenHands accepts a bare URL string for remote servers; keep that for old clients.
        if isinstance(data, dict):
            data = dict(data)
            for key in ("sse_servers", "shttp_servers"):
                items = data.get(key)
                if isinstance(items, list):
                    data[key] = [{"url": i} if isinstance(i, str) else i for i in items]
        return data

    def masked(self) -> MCPConfig:
        """A copy with every api_key replaced by the mask (null stays null)."""
        copy = self.model_copy(deep=True)
        for server in [*copy.sse_servers, *copy.shttp_servers]:
            if server.api_key:
                server.api_key = MASK
        for stdio in copy.stdio_servers:
            stdio.env = {k: MASK for k in stdio.env}
        return copy

    def merged_with(self, stored: MCPConfig | None) -> MCPConfig:
        """Replace masked values sent back by a client with what is stored for the same server.

        A client that reads settings and posts them back sends the mask, not the key; that must
        not overwrite the real key with the mask.
        """
        if stored is None:
            return self
        merged = self.model_copy(deep=True)
        old_remote = {s.url: s.api_key for s in [*stored.sse_servers, *stored.shttp_servers]}
        for server in [*merged.sse_servers, *merged.shttp_servers]:
            if server.api_key == MASK:
                server.api_key = old_remote.get(server.url)
        old_env = {s.name: s.env for s in stored.stdio_servers}
        for stdio in merged.stdio_servers:
            previous = old_env.get(stdio.name, {})
            stdio.env = {k: (previous.get(k, "") if v == MASK else v) for k, v in stdio.env.items()}
        return merged
