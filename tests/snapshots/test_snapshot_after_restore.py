"""The first snapshot of a sandbox made from a snapshot, on real Docker and a real registry: the
restored files' signatures are carried across the restore (drivers/docker/bases.py: _stamp),
so it reads only what changed since, and what changed is stored byte for byte, however the
change hides (within the second of the restore, at the same size, the mtime set back)."""

from __future__ import annotations

import docker

from tests.support.snapshot_helpers import running, sh, snapshot
from tests.support.types import Client, UserHeaders

BIG = 3_000_000
WRITE = (
    f"head -c {BIG} /dev/urandom > /workspace/big.bin && printf aaaa > /workspace/a.txt"
    " && printf bbbb > /workspace/b.txt && printf cccc > /workspace/c.txt"
    " && mkdir -p /home/agent/.local && printf v1 > /home/agent/.local/tool"
)
# Right after the restore, each change as hard to see as it gets: the same size, within the
# same second; b.txt's mtime set back to what it was (`touch -d`); a mode change alone.
CHANGE = (
    "cd /workspace && printf AAAA > a.txt"
    ' && m="$(stat -c %y b.txt)" && printf BBBB > b.txt && touch -d "$m" b.txt'
    ' && chmod 600 c.txt && m="$(stat -c %y /home/agent/.local/tool)"'
    ' && printf v2 > /home/agent/.local/tool && touch -d "$m" /home/agent/.local/tool'
)
LOOK = (
    "cd /workspace && cat a.txt b.txt c.txt /home/agent/.local/tool && echo"
    " && stat -c %a c.txt && sha256sum big.bin | cut -c1-64"
)


async def test_the_first_snapshot_after_a_restore_reads_only_what_changed(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = await running(snap, alice)
    await sh(docker_client, test_prefix, source["id"], WRITE)
    digest = (await sh(docker_client, test_prefix, source["id"], LOOK)).split()[-1]
    first = await snapshot(snap, alice, source["id"])
    assert first["read_bytes"] >= BIG  # the sandbox's first: every file is read

    restored = await running(snap, alice, snapshot_id=first["id"])
    await sh(docker_client, test_prefix, restored["id"], CHANGE)
    second = await snapshot(snap, alice, restored["id"])
    assert second["parent_id"] == first["id"]
    # The restored files are known: big.bin is not read again, the changed ones are.
    assert 4 * 3 + 2 <= second["read_bytes"] < BIG, second
    assert second["size_bytes"] >= BIG

    # What it holds is what the restored sandbox had, byte for byte, changes included.
    again = await running(snap, alice, snapshot_id=second["id"])
    seen = (await sh(docker_client, test_prefix, again["id"], LOOK)).split()
    assert seen == ["AAAABBBBccccv2", "600", digest]

    # Untouched since its restore, the next one reads about nothing; a change is read.
    third = await snapshot(snap, alice, again["id"])
    assert third["read_bytes"] < BIG, third
    await sh(docker_client, test_prefix, again["id"], "printf zz > /home/agent/.local/tool")
    fourth = await snapshot(snap, alice, again["id"])
    assert fourth["parent_id"] == third["id"]
    assert fourth["read_bytes"] >= 2
    last = await running(snap, alice, snapshot_id=fourth["id"])
    seen = (await sh(docker_client, test_prefix, last["id"], LOOK)).split()
    assert seen == ["AAAABBBBcccczz", "600", digest]
