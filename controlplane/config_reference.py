"""docs/configuration.md's tables, written from the configuration models (controlplane/config.py
and each runtime's settings, drivers/*/settings.py) so that the page lists exactly the fields
the code has, grouped as the code groups them:
`python -m controlplane.config_reference` rewrites the part of the page between its markers, and
tests/app/test_config_reference.py fails while the page is behind the code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from controlplane.config import ENV_PREFIX, GROUPS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN = (
    "<!-- The tables below are written from controlplane/config.py and the runtimes' settings "
    "(drivers/*/settings.py) by `python -m controlplane.config_reference`: edit the field "
    "descriptions there. -->"
)
END = "<!-- End of the generated tables. -->"


def default_text(info: FieldInfo) -> str:
    """The default as the page shows it: in words where the field says so
    (`json_schema_extra={"shown_default": …}`), else its value as the variable is written."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(shown := extra.get("shown_default"), str):
        return shown
    value: Any = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]  # no factory here takes the data
    if value is None or value == []:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, list):  # as the variable is written: comma-separated
        return f"`{','.join(str(item) for item in value)}`"
    if isinstance(value, dict):
        return f"`{value or '{}'}`"
    return f"`{value}`"


def render() -> str:
    """Every group: a heading from its docstring, then its variables."""
    parts = []
    for group in GROUPS:
        title = (group.__doc__ or group.__name__).strip()
        rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
        for name, info in group.model_fields.items():
            variable = f"`{ENV_PREFIX}{name.upper()}`"
            rows.append(f"| {variable} | {default_text(info)} | {info.description} |")
        parts.append(f"### {title}\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def generated_part(page: str) -> str:
    """What the page holds between the markers (raises ValueError when they are missing)."""
    start = page.index(BEGIN) + len(BEGIN)
    return page[start : page.index(END, start)].strip("\n") + "\n"


def rewrite(path: Path = PAGE) -> bool:
    """Write the tables into the page; True when it changed."""
    page = path.read_text()
    start = page.index(BEGIN) + len(BEGIN)
    end = page.index(END, start)
    new = page[:start] + "\n\n" + render() + "\n" + page[end:]
    if new == page:
        return False
    path.write_text(new)
    return True


if __name__ == "__main__":
    changed = rewrite()
    print(f"{PAGE}: {'rewritten' if changed else 'already current'}", file=sys.stderr)
