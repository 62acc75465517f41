"""The snapshot store's client: the OCI distribution API (v2) of any registry (the distribution
registry, Harbor, Zot, ECR, GHCR...), over aiohttp.

Only what snapshots need: blobs (monolithic upload, download with its digest verified,
existence, delete) and manifests (put by tag, get, delete by digest). Authentication: none,
HTTP Basic, or the registries' bearer-token challenge (a token asked of the realm the 401 names,
with the Basic credentials, kept per scope until it is refused).

Why not a client library: PyPI's `oras` (0.2.x, the ORAS project's Python SDK) is synchronous
(requests), uploads only from file paths, has no blob delete, and its request wrapper retries
every failure five times with sleeps of 3 to 83 s, so a store that is down would hold a request
for minutes instead of answering 503 at once (docs/operations.md#snapshot-store).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
from typing import Any

import aiohttp
import structlog

from controlplane.errors import SnapshotDamaged, StoreUnavailable

log = structlog.get_logger(__name__)

THREAD_HASH = 1 << 20  # bytes: a smaller blob is hashed in place (a thread costs more)
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """A manifest as it is sent (so its digest is known before)."""
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()


class Registry:
    """One registry at `base_url` (`http(s)://host[:port]`); `http` is the caller's session."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self._http = http
        self.base_url = base_url.rstrip("/")
        self._basic = aiohttp.BasicAuth(username, password or "") if username is not None else None
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 5.0))
        self._tokens: dict[str, str] = {}

    # -- blobs ----------------------------------------------------------------------------------

    async def put_blob(self, repo: str, data: bytes, *, digest: str | None = None) -> str:
        """Store `data`; its digest (`digest`, when the caller has it: not hashed again; the
        registry checks it against the bytes and refuses a wrong one). A blob the registry
        holds already is stored again (cheap: the registry keeps one copy per digest)."""
        digest = digest or digest_of(data)
        status, headers, _ = await self._call("POST", f"/v2/{repo}/blobs/uploads/", repo, "push")
        location = headers.get("Location", "")
        if status != 202 or not location:
            raise StoreUnavailable(f"the snapshot store refused an upload ({status})")
        if location.startswith("/"):
            location = self.base_url + location
        separator = "&" if "?" in location else "?"
        status, _, _ = await self._call(
            "PUT",
            f"{location}{separator}digest={digest}",
            repo,
            "push",
            data=data,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
        )
        if status != 201:
            raise StoreUnavailable(f"the snapshot store refused a blob ({status})")
        return digest

    async def get_blob(self, repo: str, digest: str) -> bytes:
        """The blob, its digest checked. Raises SnapshotDamaged when the bytes do not match
        (or the blob is gone), StoreUnavailable when the store does not answer."""
        status, _, body = await self._call("GET", f"/v2/{repo}/blobs/{digest}", repo, "pull")
        if status == 404:
            raise SnapshotDamaged(f"blob {digest} is missing from the snapshot store")
        if status != 200:
            raise StoreUnavailable(f"the snapshot store did not give blob {digest} ({status})")
        # A pack's hash off the event loop (hashlib lets go of the GIL for it): the loop keeps
        # serving while a restore reads many.
        found = (
            await asyncio.to_thread(digest_of, body) if len(body) > THREAD_HASH else digest_of(body)
        )
        if found != digest:
            raise SnapshotDamaged(
                f"blob {digest} from the snapshot store does not match its digest (corrupted)"
            )
        return body

    async def get_blob_range(self, repo: str, digest: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the blob (a Range request; a store that answers with the whole
        blob is sliced). Not checked against the blob's digest, which covers only the whole
        blob: the caller checks what it reads (a pack's chunks are each authenticated and
        hashed). Raises SnapshotDamaged when the blob is gone or shorter, StoreUnavailable
        when the store does not answer."""
        status, _, body = await self._call(
            "GET",
            f"/v2/{repo}/blobs/{digest}",
            repo,
            "pull",
            headers={"Range": f"bytes={start}-{end - 1}"},
        )
        if status in (404, 416):
            raise SnapshotDamaged(f"blob {digest} is missing from the snapshot store or short")
        if status == 200:
            body = body[start:end]
        elif status != 206:
            raise StoreUnavailable(f"the snapshot store did not give blob {digest} ({status})")
        if len(body) != end - start:
            raise SnapshotDamaged(
                f"blob {digest} in the snapshot store is shorter than its index says"
            )
        return body

    async def blob_exists(self, repo: str, digest: str) -> bool:
        status, _, _ = await self._call("HEAD", f"/v2/{repo}/blobs/{digest}", repo, "pull")
        if status not in (200, 404):
            raise StoreUnavailable(f"the snapshot store did not answer for {digest} ({status})")
        return status == 200

    async def delete_blob(self, repo: str, digest: str) -> bool:
        """Gone from the repository; "already gone" succeeds. False: it was not there."""
        status, _, _ = await self._call("DELETE", f"/v2/{repo}/blobs/{digest}", repo, "delete")
        if status not in (202, 404):
            raise StoreUnavailable(f"the snapshot store did not delete {digest} ({status})")
        return status == 202

    # -- manifests ------------------------------------------------------------------------------

    async def put_manifest(self, repo: str, tag: str, manifest: dict[str, Any]) -> str:
        """Store `manifest` under `tag`; its digest."""
        body = manifest_bytes(manifest)
        status, _, _ = await self._call(
            "PUT",
            f"/v2/{repo}/manifests/{tag}",
            repo,
            "push",
            data=body,
            headers={"Content-Type": MANIFEST_TYPE},
        )
        if status != 201:
            raise StoreUnavailable(f"the snapshot store refused a manifest ({status})")
        return digest_of(body)

    async def get_manifest(self, repo: str, reference: str) -> dict[str, Any] | None:
        """The manifest of a tag or digest; None when there is none."""
        status, _, body = await self._call(
            "GET",
            f"/v2/{repo}/manifests/{reference}",
            repo,
            "pull",
            headers={"Accept": MANIFEST_TYPE},
        )
        if status == 404:
            return None
        if status != 200:
            raise StoreUnavailable(f"the snapshot store did not give {reference} ({status})")
        manifest: dict[str, Any] = json.loads(body)
        return manifest

    async def delete_manifest(self, repo: str, digest: str) -> bool:
        """The manifest (and so its tag) gone; "already gone" succeeds. False: it was not
        there."""
        status, _, _ = await self._call("DELETE", f"/v2/{repo}/manifests/{digest}", repo, "delete")
        if status not in (202, 404):
            raise StoreUnavailable(f"the snapshot store did not delete {digest} ({status})")
        return status == 202

    async def ping(self) -> bool:
        """True when the registry answers its API root (with our credentials); never raises."""
        try:
            status, _, _ = await self._call("GET", "/v2/", "", "")
        except StoreUnavailable:
            return False
        return status == 200

    # -- plumbing -------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        repo: str,
        action: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request (again once with a fresh token after a 401 challenge): status, headers,
        body. A store that does not answer raises StoreUnavailable."""
        url = path if path.startswith("http") else self.base_url + path
        scope = f"repository:{repo}:{action}" if repo else ""
        for attempt in range(2):
            sent = dict(headers or {})
            token = self._tokens.get(scope)
            if token is not None:
                sent["Authorization"] = f"Bearer {token}"
            try:
                # A file-like body: aiohttp sends it in pieces (a large bytes body would be
                # one write, which it warns against).
                async with self._http.request(
                    method,
                    url,
                    data=io.BytesIO(data) if data is not None else None,
                    headers=sent,
                    auth=self._basic if token is None else None,
                    timeout=self._timeout,
                    allow_redirects=method in ("GET", "HEAD"),
                ) as answer:
                    body = await answer.read()
                    if answer.status == 401 and attempt == 0:
                        challenge = answer.headers.get("WWW-Authenticate", "")
                        if challenge.lower().startswith("bearer "):
                            self._tokens[scope] = await self._token(challenge)
                            continue
                    return answer.status, dict(answer.headers), body
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                log.warning("snapshot_store_unreachable", url=self.base_url, error=str(exc))
                raise StoreUnavailable(
                    f"the snapshot store at {self.base_url} does not answer: {exc or 'timeout'}"
                ) from None
        raise StoreUnavailable("the snapshot store refused our credentials")

    async def _token(self, challenge: str) -> str:
        """A bearer token from the realm a 401 challenge names, asked with our credentials."""
        fields = dict(_CHALLENGE.findall(challenge))
        realm = fields.pop("realm", "")
        if not realm.startswith(("http://", "https://")):
            raise StoreUnavailable("the snapshot store's challenge names no token realm")
        try:
            async with self._http.get(
                realm, params=fields, auth=self._basic, timeout=self._timeout
            ) as answer:
                if answer.status != 200:
                    raise StoreUnavailable(
                        f"the snapshot store's token service refused us ({answer.status})"
                    )
                payload = await answer.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise StoreUnavailable(f"the snapshot store's token service failed: {exc}") from None
        token = payload.get("token") or payload.get("access_token")
        if not isinstance(token, str) or not token:
            raise StoreUnavailable("the snapshot store's token service gave no token")
        return token
