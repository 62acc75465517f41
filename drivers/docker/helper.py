"""One run of drivers/files_helper.py in a helper container, and the conversation with it.

The helper is created with the mounts its work needs, attached (stdin, stdout, stderr) before
it starts, and removed at the end whatever happened. Its frames (files_helper.py) travel inside
the engine's attach stream, which multiplexes stdout and stderr with 8-byte headers. Every
method blocks: call them from a thread (drivers/docker/files.py does).
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import socket
import struct
import tarfile
from collections.abc import Iterator
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import Mount

from drivers.errors import DriverError, ImageMissing
from drivers.helper_answers import SCRIPT

LABEL_ROLE = "acs.role"
"""On what the snapshot capability makes besides sandboxes: `files` (a helper or a loader
container), `base` (a base volume, or the container a base image is committed from)."""
LABEL_OWNER = "acs.files_prefix"
"""The deployment's prefix on those objects: not acs.prefix, so that no listing or event of
sandboxes ever sees them (drivers/docker/files.py sweeps what an interrupted operation left)."""
ROLE = "files"
# What copying files with their owners, modes, whiteouts and overlay attributes takes, and no
# more: reading any file (DAC_READ_SEARCH), writing any (DAC_OVERRIDE, FOWNER), setting owners
# (CHOWN), making whiteouts (MKNOD), overlay's trusted.* attributes (SYS_ADMIN). No network, no
# new privileges, and only our own program runs in it.
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "MKNOD", "SYS_ADMIN"]
STAGE_CAPABILITIES = [*CAPABILITIES, "FSETID"]
"""A fork's export, which also lays the workspace down in the new base (files_helper.py:
`place`): keeping set-group-id bits on what it gives to another group takes FSETID."""
LINK_CAPABILITIES = ["DAC_READ_SEARCH", "FOWNER"]
"""What linking files of the agent's user takes (the rewind's `reuse`, which sees the engine's
whole volume directory): walking directories of any mode (DAC_READ_SEARCH) and hard-linking
files it does not own under fs.protected_hardlinks (FOWNER). It writes only directories it
makes itself, as root."""
_HEADER = struct.Struct(">BxxxI")


class HelperFailed(DriverError):
    """The helper program stopped with an error (its last words are the message)."""


class Helper:
    """A started helper container with its attach socket."""

    def __init__(self, client: docker.DockerClient, container_id: str, sock: Any) -> None:
        self._client = client
        self.container_id = container_id
        self._raw: socket.socket = sock._sock if hasattr(sock, "_sock") else sock
        self._holder = sock  # keeps the engine's response (and so the socket) alive
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._eof = False

    @classmethod
    def start(
        cls,
        client: docker.DockerClient,
        *,
        image: str,
        prefix: str,
        sandbox_id: str,
        mounts: list[Mount],
        files: dict[str, bytes] | None = None,
        capabilities: list[str] = CAPABILITIES,
    ) -> Helper:
        """Create, attach and start a helper with `mounts` and `files` (name -> bytes, put in
        its /tmp by the engine before it starts: faster than its stdin for anything large) and
        `capabilities` (its only ones); removed again on failure."""
        name = f"{prefix}files-{secrets.token_hex(6)}"
        labels = {
            LABEL_OWNER: prefix,
            LABEL_ROLE: ROLE,
        }
        host_config = client.api.create_host_config(
            mounts=mounts,
            network_mode="none",
            cap_drop=["ALL"],
            cap_add=capabilities,
            security_opt=["no-new-privileges:true"],
            pids_limit=32,
            mem_limit=512 * 1024**2,
        )
        try:
            created = client.api.create_container(
                image,
                ["python3", "-I", "-S", "-c", SCRIPT],
                name=name,
                user="0:0",
                labels=labels,
                stdin_open=True,
                host_config=host_config,
                network_disabled=True,
            )
        except ImageNotFound:
            raise ImageMissing(
                f"the snapshot helper image {image} is not on this engine "
                "(ACS_SNAPSHOT_HELPER_IMAGE; `make images` builds the default)"
            ) from None
        except APIError as exc:
            raise DriverError(f"Docker refused the snapshot helper: {exc.explanation}") from None
        container_id = str(created["Id"])
        try:
            if files:
                client.api.put_archive(container_id, "/tmp", _archive(files))  # noqa: S108 (its own)
            sock = client.api.attach_socket(
                container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            client.api.start(container_id)
        except BaseException:
            _remove(client, container_id)
            raise
        return cls(client, container_id, sock)

    def put_files(self, files: dict[str, bytes]) -> None:
        """`files` (name -> bytes) put in the started helper's /tmp by the engine."""
        self._client.api.put_archive(self.container_id, "/tmp", _archive(files))  # noqa: S108 (its own)

    # -- frames ---------------------------------------------------------------------------------

    def send(self, kind: bytes, payload: bytes) -> None:
        self._raw.sendall(kind + struct.pack(">I", len(payload)) + payload)

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(b"J", json.dumps(message).encode())

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a JSON message; the helper's JSON answer."""
        self.send_json(message)
        return self.read_json()

    def read(self) -> tuple[bytes, bytes]:
        """The helper's next frame. Raises HelperFailed when it ended without one."""
        while True:
            if len(self._stdout) >= 5:
                size = struct.unpack(">I", self._stdout[1:5])[0]
                if len(self._stdout) >= 5 + size:
                    kind = bytes(self._stdout[:1])
                    payload = bytes(self._stdout[5 : 5 + size])
                    del self._stdout[: 5 + size]
                    return kind, payload
            if self._eof:
                raise HelperFailed(f"the snapshot helper failed: {self.last_words()}")
            self._pump()

    def read_json(self) -> dict[str, Any]:
        kind, payload = self.read()
        if kind != b"J":
            raise HelperFailed(f"the snapshot helper said {kind!r} out of turn")
        message: dict[str, Any] = json.loads(payload)
        return message

    def frames(self) -> Iterator[tuple[bytes, bytes]]:
        """Frames until (and without) the end frame Z."""
        while True:
            kind, payload = self.read()
            if kind == b"Z":
                return
            yield kind, payload

    def _pump(self) -> None:
        """Read one multiplexed chunk of the attach stream into stdout or stderr."""
        header = self._exactly(_HEADER.size)
        if header is None:
            self._eof = True
            return
        stream, size = _HEADER.unpack(header)
        data = self._exactly(size) or b""
        (self._stderr if stream == 2 else self._stdout).extend(data)

    def _exactly(self, size: int) -> bytes | None:
        parts = bytearray()
        while len(parts) < size:
            data = self._raw.recv(min(size - len(parts), 1 << 20))
            if not data:
                return None
            parts.extend(data)
        return bytes(parts)

    def last_words(self) -> str:
        text = self._stderr.decode(errors="replace").strip().splitlines()
        return text[-1] if text else "it ended without a word"

    def close(self) -> None:
        """Close the stream and remove the container (forced)."""
        with contextlib.suppress(OSError):
            self._raw.close()
        with contextlib.suppress(Exception):
            self._holder.close()
        _remove(self._client, self.container_id)


def _archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _remove(client: docker.DockerClient, container_id: str) -> None:
    with contextlib.suppress(NotFound):
        try:
            client.api.remove_container(container_id, force=True, v=True)
        except APIError as exc:
            if exc.status_code != 409:  # 409: a removal in progress
                raise DriverError(f"Docker could not remove a snapshot helper: {exc}") from None
