"""Files the agent names as an image layer's whiteouts (".wh.x", ".wh..wh..opq") outside the
workspace. On Docker a base's system tree becomes an image layer (its holder's writable layer,
committed): there the engine takes such a file for a whiteout, which would hide the image's
file it names (or, opaque, the image's whole directory) in every sandbox made from the
snapshot, a file the agent could not delete itself included. They are left out of the base,
by the fork's export helper (files_helper.py `place`) and by the engine's extraction of a
restore (bases.py `reserved`): the sandboxes made from the snapshot see the source's files
but those."""

from __future__ import annotations

import docker

from tests.support.log_capture import capture_logs
from tests.support.snapshot_helpers import fork_one, running, sh, snapshot
from tests.support.types import Client, UserHeaders

# The image's ~/.bashrc (skeleton, from useradd) and the agent's own files beside files named
# as whiteouts of them, of a directory, and a directory so named.
MAKE = (
    "mkdir -p ~/layer ~/.wh.dir && echo a > ~/layer/keep && echo b > ~/layer/.wh.keep"
    " && echo c > ~/layer/.wh..wh..opq && echo d > ~/.wh..bashrc && echo e > ~/.wh.dir/inner"
    " && echo f > ~/.wh..wh..opq"
)
LOOK = "cd ~ && find . | sort && md5sum .bashrc layer/keep"


def without_whiteout_names(listing: str) -> str:
    return "".join(line + "\n" for line in listing.splitlines() if ".wh." not in line)


async def test_files_named_as_whiteouts_hide_nothing_in_forks_and_restores(
    snap: Client, user_headers: UserHeaders, docker_client: docker.DockerClient, test_prefix: str
) -> None:
    alice = await user_headers("alice")
    source = (await running(snap, alice))["id"]
    await sh(docker_client, test_prefix, source, MAKE)
    seen = await sh(docker_client, test_prefix, source, LOOK)
    assert "./.bashrc\n" in seen, seen
    assert "./.wh.dir/inner\n" in seen, seen
    expected = without_whiteout_names(seen)

    with capture_logs("info") as logs:
        fork, _ = await fork_one(snap, alice, source)
    assert await sh(docker_client, test_prefix, fork, LOOK) == expected
    # Laid down by the export's helper (the base whole at the export's end), those left out.
    (placed,) = logs.events("snapshot_base_placed")
    assert placed["reserved"] == 6, placed

    # A plain restore: the base built from the store, extracted by the engine.
    taken = await snapshot(snap, alice, source)
    with capture_logs("info") as logs:
        restored = (await running(snap, alice, snapshot_id=taken["id"]))["id"]
    assert await sh(docker_client, test_prefix, restored, LOOK) == expected
    (left_out,) = logs.events("snapshot_whiteout_names_left_out")
    assert left_out["count"] == 6, left_out
