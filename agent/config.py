"""Runtime configuration of the agent server."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

#: Session API keys are read from OH_SESSION_API_KEYS_0, OH_SESSION_API_KEYS_1, ...
API_KEYS_ENV_PATTERN = re.compile(r"^OH_SESSION_API_KEYS_(\d+)$")
#: Fallback single key, used only when no OH_SESSION_API_KEYS_<n> is set.
FALLBACK_API_KEY_ENV = "SESSION_API_KEY"
#: Default working directory for commands and relative file paths.
WORKSPACE_ENV = "ACS_WORKSPACE"
#: Where conversations are persisted (outside the workspace).
STATE_DIR_ENV = "ACS_STATE_DIR"
DEFAULT_STATE_DIR = "/var/lib/acs-agent"
#: Base URL of the control plane's webhooks for this sandbox; absent: no webhooks.
WEBHOOK_BASE_URL_ENV = "OH_WEBHOOKS_0_BASE_URL"
#: Browser origins allowed by CORS: OH_ALLOW_CORS_ORIGINS_0, _1, ... or a JSON list.
CORS_ORIGINS_ENV = "OH_ALLOW_CORS_ORIGINS"

DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
DEFAULT_POST_EXIT_GRACE = 1.0


def load_api_keys(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Return the configured session API keys (empty values are ignored).

    All ``OH_SESSION_API_KEYS_<n>`` variables are used, ordered by ``n``; gaps
    in the numbering are allowed. ``SESSION_API_KEY`` is the fallback when none
    of them is set.
    """
    numbered: list[tuple[int, str]] = []
    for name, value in environ.items():
        match = API_KEYS_ENV_PATTERN.match(name)
        if match and value:
            numbered.append((int(match.group(1)), value))
    keys = [value for _, value in sorted(numbered)]
    if not keys:
        fallback = environ.get(FALLBACK_API_KEY_ENV, "")
        if fallback:
            keys.append(fallback)
    return tuple(keys)


def load_cors_origins(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``OH_ALLOW_CORS_ORIGINS`` (a JSON list) and ``OH_ALLOW_CORS_ORIGINS_<n>``, as the
    official agent server reads them; unreadable values are ignored."""
    origins: list[str] = []
    raw = environ.get(CORS_ORIGINS_ENV, "")
    if raw:
        try:
            listed = json.loads(raw)
        except ValueError:
            listed = []
        if isinstance(listed, list):
            origins.extend(str(o) for o in listed if isinstance(o, str))
    pattern = re.compile(rf"^{CORS_ORIGINS_ENV}_(\d+)$")
    numbered = sorted(
        (int(m.group(1)), v) for k, v in environ.items() if (m := pattern.match(k)) and v
    )
    origins.extend(v for _, v in numbered)
    return tuple(origins)


def is_secret_env_name(name: str) -> bool:
    """True for environment variables that carry session API keys."""
    return name == FALLBACK_API_KEY_ENV or API_KEYS_ENV_PATTERN.match(name) is not None


@dataclass(frozen=True)
class AgentConfig:
    """Everything the HTTP application needs to know.

    ``api_keys`` empty means "no authentication"; :mod:`agent.__main__` only
    allows that with ``--insecure-no-auth``.
    """

    workspace: Path
    api_keys: tuple[str, ...] = ()
    host: str = "0.0.0.0"  # noqa: S104 - in a container; see agent.__main__
    port: int = 8000
    #: Cap on captured stdout and on captured stderr of one command, in bytes.
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    #: Seconds to keep reading a command's output after bash itself exited
    #: (background jobs that keep the pipes open are then left alone).
    post_exit_grace: float = DEFAULT_POST_EXIT_GRACE
    #: Directory for the conversations' state (None: nothing is persisted).
    state_dir: Path | None = None
    #: ``OH_WEBHOOKS_0_BASE_URL``: events and conversation updates are POSTed below it.
    webhook_base_url: str | None = None
    #: Browser origins allowed by CORS besides localhost (``OH_ALLOW_CORS_ORIGINS_<n>``).
    cors_origins: tuple[str, ...] = ()

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        workspace: str | Path | None = None,
        **overrides: object,
    ) -> AgentConfig:
        """Build a config from environment variables plus explicit overrides."""
        env = os.environ if environ is None else environ
        ws = workspace if workspace is not None else env.get(WORKSPACE_ENV) or os.getcwd()
        settings: dict[str, object] = {
            "state_dir": Path(env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR),
            "webhook_base_url": env.get(WEBHOOK_BASE_URL_ENV) or None,
            "cors_origins": load_cors_origins(env),
        }
        settings.update(overrides)
        return cls(
            workspace=Path(ws).expanduser().resolve(),
            api_keys=load_api_keys(env),
            **settings,  # type: ignore[arg-type]  # pydantic validates the values
        )


#: Where create_app() stores the AgentConfig on the aiohttp application.
CONFIG_KEY = web.AppKey("config", AgentConfig)
