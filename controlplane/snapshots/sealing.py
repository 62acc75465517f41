"""Encryption of snapshots at rest, per user, and the ids that let a user's identical content be
stored once.

Each user has two 256-bit keys derived (HKDF, controlplane/crypto.py) from the control plane's
secret: one names chunks (HMAC-SHA-256 of the plain bytes, 128 bits kept), one seals them
(AES-256-GCM, a random nonce, the chunk's id as associated data). The same bytes get the same id
in all of a user's snapshots, so they are stored once; nobody without the user's key can tell
from the store what a chunk holds, nor match it against another user's (their keys differ).
The trade-off (docs/sandboxes.md#snapshots): whoever holds the control plane's secret and the
store can tell whether a user's snapshots hold a given file.

A sealed chunk is nonce (12 bytes) + ciphertext + tag (16 bytes); its plaintext is one flag
byte (0: stored, 1: zlib) and the bytes. Opening checks the tag and that the bytes hash to the
id they were asked by: a damaged or swapped chunk is refused, never restored.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import zlib

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.crypto import SecretBox
from controlplane.errors import SnapshotDamaged

NONCE = 12
SEAL_OVERHEAD = NONCE + 16 + 1
_SAMPLE = 4096


def _squeeze(data: bytes) -> bytes:
    """The flagged plaintext: zlib (level 1) when a sample of the bytes shrinks by a tenth
    (source code, logs), as they are otherwise (random or compressed data costs no CPU)."""
    if len(data) >= 512 and len(zlib.compress(data[:_SAMPLE], 1)) < 0.9 * min(len(data), _SAMPLE):
        packed = zlib.compress(data, 1)
        if len(packed) < len(data):
            return b"\x01" + packed
    return b"\x00" + data


def _unsqueeze(flagged: bytes) -> bytes:
    if flagged[:1] == b"\x01":
        return zlib.decompress(flagged[1:])
    if flagged[:1] == b"\x00":
        return flagged[1:]
    raise ValueError("unknown chunk encoding")


class UserKeys:
    """One user's snapshot keys."""

    def __init__(self, box: SecretBox, user: str) -> None:
        self._ids = box.derive_key(f"snapshot-chunk-ids:{user}")
        self._aead = AESGCM(box.derive_key(f"snapshot-data:{user}"))

    def chunk_id(self, data: bytes) -> str:
        return hmac.new(self._ids, data, hashlib.sha256).hexdigest()[:32]

    def seal(self, chunk_id: str, data: bytes) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, _squeeze(data), chunk_id.encode())

    def open(self, chunk_id: str, sealed: bytes, where: str) -> bytes:
        """The chunk's bytes. Raises SnapshotDamaged (naming `where`) when it is not what was
        sealed under this id."""
        try:
            flagged = self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], chunk_id.encode())
            data = _unsqueeze(flagged)
        except (InvalidTag, ValueError, zlib.error):
            raise SnapshotDamaged(f"{where}: a chunk fails its authentication (damaged)") from None
        if not hmac.compare_digest(self.chunk_id(data), chunk_id):
            raise SnapshotDamaged(f"{where}: a chunk does not match its digest (damaged)")
        return data

    def seal_index(self, snapshot_id: str, data: bytes) -> bytes:
        """The index of a snapshot (its file list), bound to the snapshot's id."""
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, _squeeze(data), f"index:{snapshot_id}".encode())

    def open_index(self, snapshot_id: str, sealed: bytes) -> bytes:
        try:
            return _unsqueeze(
                self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], f"index:{snapshot_id}".encode())
            )
        except (InvalidTag, ValueError, zlib.error):
            raise SnapshotDamaged(
                f"snapshot {snapshot_id}: its index fails its authentication (damaged)"
            ) from None


def repository(box: SecretBox, base: str, user: str) -> str:
    """The user's repository in the store: a name that does not spell the user's id."""
    key = box.derive_key("snapshot-repository")
    return f"{base}/u{hmac.new(key, user.encode(), hashlib.sha256).hexdigest()[:24]}"
