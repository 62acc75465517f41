"""What both runtimes make of their snapshot helpers' conversation (drivers/files_helper.py): the
program itself, the signatures an export already knows, as the helper reads them, and its
answers checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from drivers.base import FileEntry
from drivers.errors import DriverError, FilesTooDeep, FilesTooLarge

SCRIPT = (Path(__file__).parent / "files_helper.py").read_text()
"""The helper's program, run by each runtime's helper with `python3 -I -S -c`."""


def known_by_tree(known: Mapping[tuple[str, str], FileEntry]) -> dict[str, dict[str, list[object]]]:
    """{tree: {path: signature}}: `known` as the helper reads it."""
    by_tree: dict[str, dict[str, list[object]]] = {}
    for (tree, path), entry in known.items():
        by_tree.setdefault(tree, {})[path] = list(entry.signature())
    return by_tree


def unchanged(known: Mapping[tuple[str, str], FileEntry], raw: dict[str, Any]) -> FileEntry:
    """The entry a listing names as unchanged ({"t", "p", "c": false}): the caller's own,
    marked so. Raises DriverError for a name the caller never gave (a listing not ours)."""
    entry = known.get((str(raw.get("t")), str(raw.get("p"))))
    if entry is None:
        raise DriverError(f"the snapshot helper named an entry it was not given: {raw!r:.200}")
    return entry if not entry.changed else replace(entry, changed=False, name="")


def checked(answer: dict[str, Any], *, scratch_setting: str = "") -> dict[str, Any]:
    """The helper's answer, unless it refused the export (before copying) as too large (for
    the export, or for the helper's scratch space, which `scratch_setting` sizes) or as nested
    too deep."""
    if "too_deep" in answer:
        raise FilesTooDeep(
            f"the sandbox's {answer.get('tree')} tree has directories nested more than "
            f"{answer['too_deep']} levels deep ({answer.get('path')}), deeper than a snapshot "
            "goes; flatten or remove them, then retry"
        )
    if "too_large" in answer and answer.get("scratch"):
        raise FilesTooLarge(
            f"the sandbox's changed files need {answer['too_large']} bytes of the snapshot "
            f"helper's scratch space, more than it has ({answer['limit']} bytes, "
            f"{scratch_setting}); remove some, then retry"
        )
    if "too_large" in answer:
        raise FilesTooLarge(
            f"the sandbox's changed files are {answer['too_large']} bytes, more than a snapshot "
            f"may copy ({answer['limit']} bytes, ACS_SNAPSHOT_MAX_CHANGED_BYTES); remove some, "
            "then retry"
        )
    return answer
