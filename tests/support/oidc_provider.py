"""A real OpenID Connect provider for the tests: npm `oidc-provider` (panva's, OpenID Certified)
run on Node by our script tests/support/oidc_provider.mjs, with users, groups, clients and
signing keys the test chooses.

The package is installed once per data dir and version into $ACS_DATA_DIR/build/oidc-provider/
<version>/ (`make test-prep`; lock-protected like the Agent Canvas download), so later runs need
no network. A test starts the provider like redis-server (`OidcProvider.start()`, on a free
loopback port), disables a user by rewriting its users file, and rotates the signing keys by
restarting it with new ones (its grants and refresh tokens are kept in a store file, as a real
provider keeps them in its database).

    python -m tests.support.oidc_provider    (make test-prep)
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import RSAKey

from tests.support import processes
from tests.support.live_server import free_port
from tests.support.npm_cache import cached
from tests.support.openhands_clients import build_dir

PACKAGE = "oidc-provider"
VERSION = "9.13.3"
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
CLIENT_ID = "acs"
OTHER_CLIENT_ID = "other-app"
"""A second client of the same provider: its ID tokens must not open a session with us."""


def install(version: str = VERSION, build: Path | None = None) -> Path:
    """The directory holding node_modules/oidc-provider at `version`, installed if missing."""
    build = build or build_dir()
    root = build / "oidc-provider" / version
    return cached(build / "oidc-provider.lock", root, lambda r, npm: _npm_install(r, npm, version))


def _npm_install(root: Path, npm: str, version: str) -> None:
    (root / "package.json").write_text('{"name": "acs-oidc-fixture", "private": true}\n')
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--silent", f"{PACKAGE}@{version}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=root,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm install {PACKAGE}@{version} failed:\n{done.stderr[-3000:]}")


def new_signing_key() -> dict[str, Any]:
    """A fresh RS256 signing key (private JWK) with a kid of its own."""
    key = RSAKey.generate_key(
        2048, parameters={"kid": secrets.token_hex(8), "use": "sig", "alg": "RS256"}
    )
    return key.as_dict(private=True)


@dataclass
class OidcUser:
    email: str
    name: str
    groups: list[str] = field(default_factory=list)
    disabled: bool = False


@dataclass
class OidcProvider:
    """One provider process. `redirect_uris` are registered for CLIENT_ID (and OTHER_CLIENT_ID)."""

    root: Path
    directory: Path
    redirect_uris: list[str]
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    users: dict[str, OidcUser] = field(default_factory=dict)
    keys: list[dict[str, Any]] = field(default_factory=lambda: [new_signing_key()])
    access_token_ttl: int = 3600
    host: str = "127.0.0.1"
    """Where it listens (a browser in a network namespace of its own reaches the link's host
    address, not loopback)."""
    port: int = 0
    process: subprocess.Popen[str] | None = None

    @property
    def issuer(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def users_file(self) -> Path:
        return self.directory / "users.json"

    def write_users(self) -> None:
        data = {uid: u.__dict__ for uid, u in self.users.items()}
        tmp = self.users_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.users_file)  # the provider never reads half a file

    def _config(self) -> dict[str, Any]:
        client = {
            "client_secret": self.client_secret,
            "redirect_uris": self.redirect_uris,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "client_secret_basic",
        }
        return {
            "issuer": self.issuer,
            "host": self.host,
            "port": self.port,
            "clients": [
                {"client_id": CLIENT_ID, **client},
                {"client_id": OTHER_CLIENT_ID, **client},
            ],
            "keys": self.keys,
            "cookie_key": secrets.token_hex(16),
            "users_file": str(self.users_file),
            "store_file": str(self.directory / "store.json"),
            "access_token_ttl": self.access_token_ttl,
        }

    def start(self) -> None:
        self.port = self.port or free_port(self.host)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_users()
        config = self.directory / "config.json"
        config.write_text(json.dumps(self._config()))
        config.chmod(0o600)
        # Node resolves `oidc-provider` from the script's own directory: run a copy beside it.
        script = self.root / "oidc_provider.mjs"
        shutil.copyfile(SCRIPT, script)
        with (self.directory / "provider.log").open("a") as log:
            self.process = subprocess.Popen(
                ["node", "--no-warnings", str(script), str(config)],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.process.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("listening"):
                return
            if not line and self.process.poll() is not None:
                break
        tail = (self.directory / "provider.log").read_text()[-3000:]
        self.stop()
        raise RuntimeError(f"oidc-provider did not start ({line!r}):\n{tail}")

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process)
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None

    def rotate_keys(self, *, keep_old: bool = False) -> dict[str, Any]:
        """Restart with a new signing key (first, so that it signs); the old one stays published
        only with `keep_old`. Returns the new key."""
        new = new_signing_key()
        self.keys = [new, *self.keys] if keep_old else [new]
        self.stop()
        self.start()
        return new

    def disable(self, user_id: str) -> None:
        self.users[user_id].disabled = True
        self.write_users()


@pytest.fixture(scope="session")
def oidc_provider_root() -> Path:
    """The installed package; fails (never skips) when npm cannot fetch it."""
    try:
        return install()
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"installing {PACKAGE}@{VERSION} failed: {exc}", pytrace=False)


def make_provider(
    root: Path, directory: Path, redirect_uris: list[str], host: str = "127.0.0.1"
) -> OidcProvider:
    """A provider with three users: alice (groups eng, eng-admins), bob (eng), carol (audit)."""
    return OidcProvider(
        root=root,
        directory=directory,
        redirect_uris=redirect_uris,
        host=host,
        users={
            "alice": OidcUser("alice@example.com", "Alice", ["eng", "eng-admins"]),
            "bob": OidcUser("bob@example.com", "Bob", ["eng"]),
            "carol": OidcUser("carol@example.com", "Carol", ["audit"]),
            "dave": OidcUser("dave@example.com", "Dave", []),
        },
    )


@pytest.fixture
def oidc_provider_factory(oidc_provider_root: Path, tmp_path: Path) -> Iterator[Any]:
    """Start providers for redirect URIs known only once the app listens; stopped after."""
    started: list[OidcProvider] = []

    def start(redirect_uris: list[str], host: str = "127.0.0.1", **overrides: Any) -> OidcProvider:
        provider = make_provider(
            oidc_provider_root, tmp_path / f"oidc-{len(started)}", redirect_uris, host
        )
        for name, value in overrides.items():
            setattr(provider, name, value)
        provider.start()
        started.append(provider)
        return provider

    yield start
    for provider in started:
        provider.stop()


if __name__ == "__main__":
    print(install(sys.argv[1]) if len(sys.argv) > 1 else install())
