"""Encryption of secrets at rest (Fernet), the replicas' agreement on the key, and hashing of
API keys."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import redis.asyncio as aioredis
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from controlplane.config import ConfigError


class SecretBox:
    """Encrypts and decrypts small secret payloads with one Fernet key."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)
        self._key = key

    def derive_key(self, purpose: str) -> bytes:
        """A 256-bit key for `purpose` (e.g. signing session cookies), derived with HKDF from this
        box's key: one secret to keep, and a leaked derived key reveals neither it nor another."""
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode())
        return hkdf.derive(self._key)

    def encrypt(self, plaintext: bytes) -> bytes:
        return self._fernet.encrypt(plaintext)

    def decrypt(self, token: bytes) -> bytes:
        """Raises ValueError when the token was not made with this key."""
        try:
            return self._fernet.decrypt(token)
        except InvalidToken:
            raise ValueError("stored secret cannot be decrypted with the configured key") from None


def load_secret_box(secret_key: str | None, data_dir: Path) -> SecretBox:
    """Use ACS_SECRET_KEY, or a key file in the data dir created on first run with mode 0600."""
    if secret_key:
        try:
            return SecretBox(secret_key.encode())
        except ValueError:
            raise ConfigError(
                "ACS_SECRET_KEY: not a Fernet key (32 url-safe base64-encoded bytes)"
            ) from None
    path = data_dir / "secret.key"
    try:
        if not path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            # O_EXCL: two processes starting at once must not write two different keys.
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(Fernet.generate_key())
        raw = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(
            f"ACS_DATA_DIR: cannot keep the secret key file {path} ({exc.strerror}); make the "
            "directory writable by this user, or set ACS_SECRET_KEY"
        ) from None
    try:
        return SecretBox(raw)
    except ValueError:
        raise ConfigError(f"ACS_SECRET_KEY: key file {path} does not hold a Fernet key") from None


def hash_api_key(key: str) -> str:
    """API keys are random 256-bit strings, so one SHA-256 round is enough to store them."""
    return hashlib.sha256(key.encode()).hexdigest()


KEY_CHECK_PURPOSE = "replicas-key-check"
KEY_CHECK_LABEL = b"acs: the deployment's secret key, v1"


def key_check_value(box: SecretBox) -> str:
    """What every replica with this key writes and compares: an HMAC of a fixed label under a
    key derived for that purpose alone (it reveals nothing of the key, nor of another derived
    key)."""
    derived = box.derive_key(KEY_CHECK_PURPOSE)
    return hmac.new(derived, KEY_CHECK_LABEL, hashlib.sha256).hexdigest()


def key_source(secret_key: str | None, data_dir: Path) -> str:
    """Where this process's key came from, in the words of its configuration."""
    if secret_key:
        return "ACS_SECRET_KEY"
    return f"the key file {data_dir / 'secret.key'} (ACS_SECRET_KEY unset, so ACS_DATA_DIR's)"


async def check_shared_key(redis: aioredis.Redis, name: str, box: SecretBox, source: str) -> None:
    """Make sure every replica of the deployment encrypts with the same key: the first to start
    writes `key_check_value` at `name` (SET NX), the others compare theirs with it. Raises
    ConfigError naming `source` (key_source) when the key differs: a replica with another key
    would write records the others cannot read, and its sandbox tokens and session cookies
    would fail on them."""
    mine = key_check_value(box)
    await redis.set(name, mine, nx=True)
    stored = await redis.get(name)
    theirs = stored.decode() if isinstance(stored, bytes) else str(stored)
    if not hmac.compare_digest(theirs, mine):
        raise ConfigError(
            f"ACS_SECRET_KEY: this replica's secret key ({source}) is not the one this "
            f"deployment's data was written with (the key check in Redis, {name}, differs); "
            "give every replica the same ACS_SECRET_KEY. Refusing to start: records written "
            "with this key could not be read by the others (docs/security.md#one-secret-key)"
        )
