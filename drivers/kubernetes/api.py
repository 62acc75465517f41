"""The Kubernetes API server as the driver speaks to it: JSON in, JSON out, every failure mapped
to the drivers' errors.

kubernetes_asyncio (an asyncio-native client generated from the Kubernetes OpenAPI, kept in step
with upstream releases) brings what a client must get right: kubeconfig contexts and their
credential plugins, in-cluster service-account tokens re-read as they rotate, TLS with the
cluster's CA. Its model objects are not used: each request goes through `ApiClient.call_api`
with `_preload_content=False` and the body is read as plain JSON, which costs a fraction of the
CPU of building model objects (a start reads a pod several times) and keeps error handling in
one place (the client raises nothing for a non-2xx answer read this way).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client as kclient
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.stream import WsApiClient

from drivers.errors import DriverError, RuntimeUnavailable
from drivers.kubernetes.settings import Credentials

log = structlog.get_logger(__name__)

Json = dict[str, Any]
TIMEOUT = 15.0
"""Seconds for one request (a watch has its own)."""
CLOSE_SETTLE = 0.05
"""Seconds close() leaves the loop for the client's closed connections to go (aiohttp's advice for
TLS connections before a loop ends)."""
PARSE_IN_THREAD = 256 * 1024
"""Bodies larger than this (a list of hundreds of pods) are parsed off the event loop."""


def pods(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def claims(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    return base + (f"/{name}" if name else "")


def services(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/services" + (f"/{name}" if name else "")


def policies(namespace: str, name: str = "") -> str:
    base = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    return base + (f"/{name}" if name else "")


NODES = "/api/v1/nodes"


def storage_class(name: str) -> str:
    return f"/apis/storage.k8s.io/v1/storageclasses/{name}"


STORAGE_CLASSES = "/apis/storage.k8s.io/v1/storageclasses"


class Forbidden(DriverError):
    """The API server refused the control plane's identity (401) or its RBAC (403)."""


class Expired(Exception):
    """410 Gone: the resourceVersion a watch asked for is older than the server keeps."""


class KubeApi:
    """One ApiClient, made at the first request. `on_error(operation)` counts failed calls
    (the metric's hook)."""

    def __init__(
        self, credentials: Credentials, on_error: Callable[[str], None] | None = None
    ) -> None:
        self._credentials = credentials
        self._on_error = on_error
        self._client: Any = None
        self._ws_client: Any = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _api(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            # Once closed, never again: a late caller (a background refresh, a loop still
            # stopping) would otherwise open a client, and its connections, nobody closes.
            if self._closed:
                raise RuntimeUnavailable("the Kubernetes client is closed")
            if self._client is None:
                self._client = await self._connect()
        return self._client

    async def _connect(self) -> Any:
        configuration = kclient.Configuration()
        creds = self._credentials
        try:
            if creds.kubeconfig is not None:
                await kconfig.load_kube_config(
                    config_file=creds.kubeconfig,
                    context=creds.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
            else:
                kconfig.load_incluster_config(
                    client_configuration=configuration,
                    token_filename=str(creds.service_account / "token"),
                    cert_filename=str(creds.service_account / "ca.crt"),
                    environ=creds.environ if creds.environ is not None else os.environ,
                )
        except (ConfigException, OSError) as exc:
            where = creds.kubeconfig or "in-cluster service account"
            raise DriverError(
                f"no Kubernetes credentials ({where}): {exc}; set ACS_KUBECONFIG, or run the "
                "control plane in a pod with a service account"
            ) from None
        self._configuration = configuration
        return kclient.ApiClient(configuration)

    async def ws(self) -> Any:
        """A websocket client with the same identity (exec streams: drivers/kubernetes/exec.py)."""
        await self._api()
        async with self._lock:
            if self._closed:
                raise RuntimeUnavailable("the Kubernetes client is closed")
            if self._ws_client is None:
                self._ws_client = WsApiClient(self._configuration)
        return self._ws_client

    def _failed(self, operation: str) -> None:
        if self._on_error is not None:
            self._on_error(operation)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Json | None = None,
        content_type: str = "application/json",
        operation: str,
        timeout: float = TIMEOUT,
    ) -> tuple[int, Json]:
        """(status, JSON body). 2xx, 404, 409 and 410 are returned; a refusal (400, 403, 422…)
        raises DriverError with the API server's message; no answer, 429 or 5xx raise
        RuntimeUnavailable."""
        api = await self._api()
        try:
            response = await api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
            try:
                raw = await response.read()
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(operation)
            raise RuntimeUnavailable(
                f"the Kubernetes API server did not answer ({operation}): {exc!r}"
            ) from None
        status = int(response.status)
        data = await parse(raw) if raw else {}
        if 200 <= status < 300 or status in (404, 409, 410):
            return status, data
        self._failed(operation)
        message = str(data.get("message") or raw[:300].decode(errors="replace"))
        if status == 429 or status >= 500:
            raise RuntimeUnavailable(f"the Kubernetes API server answered {status}: {message}")
        if status in (401, 403):
            raise Forbidden(
                f"Kubernetes refused the control plane's {operation} ({status}): {message}; "
                "see docs/deployment.md (RBAC) for the Role it needs"
            )
        raise DriverError(f"Kubernetes refused the {operation} ({status}): {message}")

    async def get(self, path: str, operation: str) -> Json | None:
        status, data = await self.request("GET", path, operation=operation)
        return data if status == 200 else None

    async def list(self, path: str, selector: str | None, operation: str) -> Json:
        query = {"labelSelector": selector} if selector else {}
        status, data = await self.request("GET", path, query=query, operation=operation)
        if status != 200:
            raise DriverError(f"Kubernetes answered {status} to the {operation}")
        return data

    async def create(self, path: str, body: Json, operation: str) -> Json | None:
        """The object as created; None when one of that name exists already (409)."""
        status, data = await self.request("POST", path, body=body, operation=operation)
        if status == 409:
            return None
        if status == 404:
            raise DriverError(f"Kubernetes answered 404 to the {operation}: {data.get('message')}")
        return data

    async def delete(
        self, path: str, operation: str, *, grace: int | None = None, uid: str | None = None
    ) -> bool:
        """False when there was nothing to delete (404, or another object of the name now)."""
        return await self.delete_object(path, operation, grace=grace, uid=uid) is not None

    async def delete_object(
        self, path: str, operation: str, *, grace: int | None = None, uid: str | None = None
    ) -> Json | None:
        """The API server's answer to a DELETE: the object as it stands after it (marked with
        its deletionTimestamp while a grace period runs); None when there was nothing to delete
        (404, or another object of the name now)."""
        body: Json = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        status, data = await self.request("DELETE", path, body=body, operation=operation)
        return None if status in (404, 409) else data

    async def patch(self, path: str, body: Json, operation: str) -> Json | None:
        """A JSON merge patch; None when the object does not exist."""
        status, data = await self.request(
            "PATCH",
            path,
            body=body,
            content_type="application/merge-patch+json",
            operation=operation,
        )
        return data if status == 200 else None

    async def watch(
        self,
        path: str,
        selector: str,
        resource_version: str,
        seconds: int,
        *,
        fields: str | None = None,
    ) -> AsyncGenerator[Json, None]:
        """The events of a watch from `resource_version` (bookmarks included) until the server
        ends it after about `seconds`; `fields`: a field selector (one object by name). Raises
        Expired when that version is too old (410), Forbidden when RBAC refuses it,
        RuntimeUnavailable when the stream breaks or the server refuses otherwise."""
        api = await self._api()
        query = {
            "watch": "true",
            "labelSelector": selector,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
            **({"fieldSelector": fields} if fields else {}),
        }
        try:
            response = await api.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                # No total: the stream lasts `seconds`; a silent connection is a broken one.
                _request_timeout=aiohttp.ClientTimeout(
                    sock_connect=TIMEOUT, sock_read=seconds + 30
                ),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed("watch")
            raise RuntimeUnavailable(f"the watch of {path} could not start: {exc!r}") from None
        try:
            if response.status == 410:
                raise Expired()
            if response.status != 200:
                self._failed("watch")
                text = (await response.read())[:300].decode(errors="replace")
                if response.status in (401, 403):
                    raise Forbidden(f"the watch of {path} was refused ({response.status}): {text}")
                raise RuntimeUnavailable(
                    f"the watch of {path} was refused ({response.status}): {text}"
                )
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    self._failed("watch")
                    raise RuntimeUnavailable(f"the watch of {path} broke: {exc!r}") from None
                if not line:
                    return
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = (event.get("object") or {}).get("code")
                    if status == 410:
                        raise Expired()
                    raise RuntimeUnavailable(f"the watch of {path} ended with an error: {event}")
                yield event
        finally:
            # Unread: the connection is not reused. Aborted rather than closed: a TLS goodbye
            # would go on in the background after the driver (and, at shutdown, the event loop)
            # had gone, leaving the socket open.
            connection = response.connection
            if connection is not None and connection.transport is not None:
                connection.transport.abort()
            response.close()

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            if self._ws_client is not None:
                await self._ws_client.close()
                self._ws_client = None
            if self._client is not None:
                await self._client.close()
                self._client = None
                # Transports closed just now (an aborted watch) finish on the loop's next turns.
                await asyncio.sleep(CLOSE_SETTLE)


async def parse(raw: bytes) -> Json:
    """JSON of an API answer; a large one is parsed in a thread (the loop keeps serving)."""
    try:
        if len(raw) > PARSE_IN_THREAD:
            data = await asyncio.to_thread(json.loads, raw)
        else:
            data = json.loads(raw)
    except ValueError:
        return {"message": raw[:300].decode(errors="replace")}
    return data if isinstance(data, dict) else {"items": data}
