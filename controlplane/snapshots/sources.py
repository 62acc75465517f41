"""The snapshots' data as the rest of the control plane reads it: a user's keys and repository,
a snapshot's index (opened, kept for a while), the caller's own snapshots, and the files of a
snapshot for a runtime to make a sandbox from (the sandboxes domain's Restores protocol)."""

from __future__ import annotations

import re
from collections import OrderedDict

from controlplane.auth.models import Principal
from controlplane.crypto import SecretBox
from controlplane.errors import SnapshotNotFound, StoreUnavailable
from controlplane.snapshots.index import SnapshotIndex
from controlplane.snapshots.models import SNAPSHOT_ID_PATTERN, SnapshotRecord, SnapshotStatus
from controlplane.snapshots.reader import Carried, SnapshotSource
from controlplane.snapshots.registry import Registry
from controlplane.snapshots.sealing import UserKeys, repository
from controlplane.snapshots.store import SnapshotStore
from drivers.base import FileSource

INDEXES_KEPT = 8
_ID = re.compile(SNAPSHOT_ID_PATTERN)


class SnapshotData:
    def __init__(
        self, store: SnapshotStore, registry: Registry, box: SecretBox, repository_base: str
    ) -> None:
        self.store = store
        self.registry = registry
        self._box = box
        self._base = repository_base
        self._keys: dict[str, UserKeys] = {}
        self._indexes: OrderedDict[str, SnapshotIndex] = OrderedDict()

    def keys(self, user: str) -> UserKeys:
        found = self._keys.get(user)
        if found is None:
            found = self._keys[user] = UserKeys(self._box, user)
        return found

    def repository(self, user: str) -> str:
        return repository(self._box, self._base, user)

    async def owned(self, principal: Principal, snapshot_id: str) -> SnapshotRecord:
        """The caller's READY snapshot. Raises SnapshotNotFound otherwise (someone else's
        included: never a 403)."""
        record = await self.store.get(snapshot_id) if _ID.match(snapshot_id) else None
        if (
            record is None
            or record.owner != principal.user_id
            or record.status != SnapshotStatus.READY
        ):
            raise SnapshotNotFound(f"snapshot {snapshot_id} not found")
        return record

    async def index(self, record: SnapshotRecord) -> SnapshotIndex:
        """A READY snapshot's index, read from the store and opened (SnapshotDamaged when it
        is not what was stored)."""
        found = self._indexes.get(record.id)
        if found is not None:
            self._indexes.move_to_end(record.id)
            return found
        sealed = await self.registry.get_blob(record.repository, record.index_digest)
        opened = self.keys(record.owner).open_index(record.id, sealed)
        index = SnapshotIndex.decode(opened)
        self.remember(record.id, index)
        return index

    def remember(self, snapshot_id: str, index: SnapshotIndex) -> None:
        self._indexes[snapshot_id] = index
        while len(self._indexes) > INDEXES_KEPT:
            self._indexes.popitem(last=False)

    def forget(self, snapshot_id: str) -> None:
        self._indexes.pop(snapshot_id, None)

    # -- the sandboxes domain's Restores --------------------------------------------------------

    async def spec_of(self, principal: Principal, snapshot_id: str) -> str:
        record = await self.owned(principal, snapshot_id)
        if not await self.registry.ping():
            raise StoreUnavailable(
                f"the snapshot store at {self.registry.base_url} does not answer; nothing "
                "was started"
            )
        return record.spec_id

    async def source(
        self, owner: str, snapshot_id: str, sandbox_id: str, *, carried: str | None = None
    ) -> FileSource:
        """The snapshot's files for sandbox `sandbox_id`: with the agent's state tree when it
        is the sandbox the snapshot was taken of (a conversation rewound in place: the state's
        credentials are that sandbox's own), else the workspace and system trees alone, and,
        with `carried` ("<source conversation id>:<new conversation id>", a conversation's
        fork), that conversation's stored events under the new id (no credential in them)."""
        taken = await self.store.get(snapshot_id) if _ID.match(snapshot_id) else None
        own = taken is not None and taken.owner == owner and taken.sandbox_id == sandbox_id

        async def index() -> SnapshotIndex:
            record = await self.store.get(snapshot_id)
            if record is None or record.owner != owner or record.status != SnapshotStatus.READY:
                raise SnapshotNotFound(f"snapshot {snapshot_id} no longer exists")
            return await self.index(record)

        return SnapshotSource(
            snapshot_id,
            self.keys(owner),
            self.registry,
            self.repository(owner),
            index,
            with_state=own,
            carried=Carried(*carried.split(":", 1)) if carried else None,
        )
