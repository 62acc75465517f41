"""Loads specs/*.yaml once at start-up; a bad file stops start-up with file, line and reason."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controlplane.api.pagination import decode_cursor, encode_cursor
from controlplane.errors import SpecInvalid, SpecNotFound
from controlplane.specs.models import (
    SPEC_ID_PATTERN,
    SandboxSpec,
    SandboxSpecInfo,
    SandboxSpecInfoPage,
)

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are): every app parses
the spec files as it is made, ten times faster than in pure Python (a few milliseconds against
about 25 for the shipped specs)."""


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at `loc`, or of the deepest parent that exists."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == str(part)), None)
            if match is None:
                return line
            line = (key or match).start_mark.line + 1
            node = match
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def load_spec_file(path: Path) -> SandboxSpec:
    """Parse and validate one file. Raises SpecInvalid naming file, line, field and reason."""
    text = path.read_text()
    try:
        node = yaml.compose(text, Loader=_LOADER)
        data: Any = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader, C or Python
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecInvalid(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecInvalid(f"{path}:1: a spec must be a YAML mapping")
    try:
        return SandboxSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "<root>"
        line = _line_of(node, loc)
        raise SpecInvalid(f"{path}:{line}: {field}: {err['msg']}") from None


def retag(image: str, tag: str) -> str:
    """`image` with its tag (the part after the last colon of the last path segment) replaced."""
    name, _, last = image.rpartition("/")
    repo = last.split(":", 1)[0].split("@", 1)[0]
    return f"{name}/{repo}:{tag}" if name else f"{repo}:{tag}"


class SpecCatalog:
    """The read-only set of templates, in id order, with exactly one default."""

    def __init__(self, specs: list[SandboxSpec], loaded_at: datetime | None = None) -> None:
        self._specs = {spec.id: spec for spec in sorted(specs, key=lambda s: s.id)}
        self._loaded_at = loaded_at or datetime.now(UTC)
        defaults = [s for s in specs if s.default]
        if len(self._specs) != len(specs):
            raise SpecInvalid("two spec files use the same id")
        if len(defaults) != 1:
            names = ", ".join(s.id for s in defaults) or "none"
            raise SpecInvalid(f"exactly one spec must have default: true (found: {names})")
        self.default = defaults[0]

    @classmethod
    def load(
        cls, spec_dir: Path, image_tag: str | None = None, enable: Iterable[str] = ()
    ) -> SpecCatalog:
        """Raises SpecInvalid for a missing dir, a bad file or a bad set of files.

        `image_tag` replaces the tag of every image built from specs/ (a spec with `build:`),
        as scripts/build-images.sh does with the same ACS_IMAGE_TAG. Specs written
        `enabled: false` are left out unless `enable` (ACS_ENABLE_SPECS) names them."""
        if not spec_dir.is_dir():
            raise SpecInvalid(f"ACS_SPEC_DIR: {spec_dir} is not a directory")
        files = sorted(spec_dir.glob("*.yaml")) + sorted(spec_dir.glob("*.yml"))
        if not files:
            raise SpecInvalid(f"ACS_SPEC_DIR: no *.yaml spec files in {spec_dir}")
        wanted = set(enable)
        specs = [load_spec_file(f) for f in files]
        unknown = wanted - {s.id for s in specs}
        if unknown:
            raise SpecInvalid(f"ACS_ENABLE_SPECS: no spec file has the id {sorted(unknown)[0]!r}")
        specs = [s for s in specs if s.enabled or s.id in wanted]
        if image_tag:
            specs = [
                s.model_copy(update={"image": retag(s.image, image_tag)}) if s.build else s
                for s in specs
            ]
        return cls(specs)

    def get(self, spec_id: str | None) -> SandboxSpec:
        """The named spec, or the default for None. Raises SpecNotFound."""
        if spec_id is None:
            return self.default
        spec = self._specs.get(spec_id)
        if spec is None:
            raise SpecNotFound(f"sandbox spec {spec_id!r} not found")
        return spec

    def find(self, spec_id: str) -> SandboxSpec | None:
        return self._specs.get(spec_id)

    def all(self) -> list[SandboxSpec]:
        return list(self._specs.values())

    def search(self, page_id: str | None, limit: int) -> SandboxSpecInfoPage:
        """The specs in id order, cursor-paged (the cursor: the last id of the page before)."""
        after = decode_cursor(page_id, SPEC_ID_PATTERN.strip("^$"))
        specs = [s for s in self._specs.values() if after is None or s.id > after]
        page = specs[:limit]
        next_page = encode_cursor(page[-1].id) if len(specs) > limit else None
        return SandboxSpecInfoPage(items=[self.info(s) for s in page], next_page_id=next_page)

    def infos(self, ids: Iterable[str]) -> list[SandboxSpecInfo | None]:
        """In the order of `ids`; None for an unknown one."""
        return [self.info(s) if (s := self._specs.get(i)) else None for i in ids]

    def info(self, spec: SandboxSpec) -> SandboxSpecInfo:
        return SandboxSpecInfo(
            id=spec.id,
            command=spec.command,
            created_at=self._loaded_at,
            initial_env=spec.initial_env,
            working_dir=spec.working_dir,
            description=spec.description,
            image=spec.image,
            default=spec.default,
            resources=spec.resources,
            exposed_ports=spec.exposed_ports,
            idle_timeout=spec.idle_timeout,
            runtime=spec.runtime,
            egress=spec.egress,
            warm_pool=spec.warm_pool,
            warm_pool_state=spec.warm_pool_state,
            agent_kind=spec.agent_kind,
        )
