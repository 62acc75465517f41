"""The helper's `reuse` (drivers/files_helper.py), which a rewind on Docker runs over the old
workspace's directories: only a file with exactly the checkpoint's signature is linked into the
new base (one written since, however it hides, is not), a layer below an overlay is used even
where the layer above shadows it (its file is still the checkpoint's), and nothing is reached
through a link the agent made."""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

import drivers.files_helper as helper


def signature(path: Path) -> list[Any]:
    entry = helper.entry_of("workspace", "", os.lstat(path), None, str(path), layer=False)
    assert entry is not None
    return helper.signature(entry)


def test_only_files_with_the_checkpoints_signature_are_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upper, lower, target, outside = (tmp_path / n for n in ("up", "lower", "new", "outside"))
    for d in (upper, lower, outside, lower / "d"):
        d.mkdir()
    (lower / "same.txt").write_bytes(b"same")
    (lower / "d" / "deep.txt").write_bytes(b"deep")
    (lower / "shadowed.txt").write_bytes(b"old")
    (lower / "hidden.txt").write_bytes(b"hush")
    (outside / "x.txt").write_bytes(b"not ours")
    known = {
        p: signature(lower / p) for p in ("same.txt", "d/deep.txt", "shadowed.txt", "hidden.txt")
    }
    known["via-link/x.txt"] = signature(outside / "x.txt")
    # Since the checkpoint: shadowed.txt rewritten above (overlay's copy-up), hidden.txt
    # rewritten in place at the same size with its mtime set back, a link to elsewhere.
    (upper / "shadowed.txt").write_bytes(b"new")
    stat = os.stat(lower / "hidden.txt")
    (lower / "hidden.txt").write_bytes(b"HUSH")
    os.utime(lower / "hidden.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (upper / "via-link").symlink_to(outside)
    (tmp_path / "known.json").write_text(json.dumps({"workspace": known}))
    answer = io.BytesIO()
    monkeypatch.setattr(helper, "out", answer)

    helper.reuse(
        {
            "known_file": str(tmp_path / "known.json"),
            "layers": [str(upper), str(lower)],
            "target": str(target),
        }
    )

    payload = answer.getvalue()
    assert payload[:1] == b"J"
    (size,) = struct.unpack(">I", payload[1:5])
    said = json.loads(payload[5 : 5 + size])
    assert sorted(said["reused"]) == ["d/deep.txt", "same.txt", "shadowed.txt"]
    assert said["bytes"] == 4 + 4 + 3
    for path in said["reused"]:  # the very files: links, not copies
        assert os.stat(target / path).st_ino == os.stat(lower / path).st_ino
    assert (target / "shadowed.txt").read_bytes() == b"old"  # the checkpoint's, not the upper's
    assert not (target / "hidden.txt").exists()
    assert not (target / "via-link").exists()
