"""The Pod Security Standards' Baseline and Restricted profiles, read from the published tables
(tests/security/data/pod-security-standards.html), and a pod checked against them.

Each control's "Restricted Fields" are paths with `[*]` wildcards; its "Allowed Values" are read
as predicates: `Undefined/nil` (absent), `Undefined/""`, `false`/`true`, `0`, `any non-zero
value`, a code value (a glob when it holds `*`), `Any list of capabilities that includes ALL`;
a list-valued field must have every item allowed. The two notes of the Restricted table
(container fields may be absent when the pod-level one is set, and the reverse for seccomp) and
the volume rule ("must set one of the following fields") are read from their wording. Wording
this reader does not know raises, so a newer table is read by a person before it is trusted.

Kubernetes 1.25+ enforces the same rules in its Pod Security Admission; the test cluster (1.20)
has none, so this is how the driver's pods are held to the profile there (docs/security.md).
"""

from __future__ import annotations

import fnmatch
import html
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLES = (
    Path(__file__).resolve().parent.parent / "security" / "data" / "pod-security-standards.html"
)
ABSENT = object()
Allowed = Callable[[Any], bool]


@dataclass
class Rule:
    control: str
    fields: list[str]
    allowed: list[str]
    note: str = ""
    one_of: list[str] = field(default_factory=list)  # the volume rule's fields


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _items(ul: str) -> list[str]:
    return [_text(li) for li in re.findall(r"<li>(.*?)(?:</li>|(?=<li>)|$)", ul, re.S)]


def _rules_of(control: str, body: str) -> Iterator[Rule]:
    note_match = re.search(r"<small>(.*?)</small>", body, re.S)
    note = _text(note_match.group(1)) if note_match else ""
    for part in body.split("<hr />"):
        fields_html, _, allowed_html = part.partition("Allowed Values")
        fields = [f for ul in re.findall(r"<ul>(.*?)</ul>", fields_html, re.S) for f in _items(ul)]
        lists = re.findall(r"<ul>(.*?)</ul>", allowed_html, re.S)
        allowed = _items(lists[0]) if lists else []
        one_of = []
        if "must set one of the following fields" in allowed_html:
            one_of, allowed = [v.rsplit(".", 1)[-1] for v in allowed], []
        yield Rule(control, fields, allowed, note, one_of)


def profile(name: str) -> list[Rule]:
    """The rules of `name` ("baseline" or "restricted": Restricted includes Baseline)."""
    text = TABLES.read_text()
    tables = {
        caption.split()[0].lower(): body
        for caption, body in re.findall(r"<caption[^>]*>(.*?)</caption>(.*?)</table>", text, re.S)
    }
    names = ["baseline"] if name == "baseline" else ["baseline", "restricted"]
    rules: list[Rule] = []
    for table in names:
        for row in re.findall(r"<tr>(.*?)</tr>", tables[table], re.S):
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
            if len(cells) == 2:
                rules.extend(_rules_of(_text(cells[0]), cells[1]))
    return rules


def _predicate(item: str) -> Allowed | None:
    """What one "Allowed Values" item admits; None for an item that admits nothing here."""
    words = re.sub(r"\s*\(since Kubernetes [0-9.]+\)$", "", item).strip()
    lowered = words.lower()
    if lowered.startswith("known list"):
        return None  # an operator's own list: the built-in admission has none
    if lowered in ("undefined/nil", "undefined/null", "undefined / nil"):
        return lambda v: v is ABSENT or v is None
    if lowered == 'undefined/""':
        return lambda v: v is ABSENT or v is None or v == ""
    if lowered == '""':
        return lambda v: v == ""
    if lowered == "any non-zero value":
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and v != 0
    if lowered == "any list of capabilities that includes all":
        return lambda v: isinstance(v, list) and "ALL" in v
    if lowered in ("true", "false"):
        flag = lowered == "true"
        return lambda v: v is flag
    if re.fullmatch(r"[0-9]+", words):
        number = int(words)
        return lambda v: v == number and not isinstance(v, bool)
    if re.fullmatch(r"[A-Za-z0-9_./*-]+", words):
        return lambda v: isinstance(v, str) and fnmatch.fnmatchcase(v, words)
    raise ValueError(f"an allowed value this reader does not know: {item!r}")


def _values(obj: Any, path: str) -> list[tuple[str, Any]]:
    """(concrete path, value or ABSENT) for a restricted field's path."""
    annotation = re.fullmatch(r'metadata\.annotations\["(.+)"\]', path)
    if annotation:
        found = obj.get("metadata", {}).get("annotations", {}) or {}
        return [
            (f"annotation {k}", v)
            for k, v in found.items()
            if fnmatch.fnmatchcase(k, annotation.group(1))
        ]
    out: list[tuple[str, Any]] = [("", obj)]
    for part in path.split("."):
        star = part.endswith("[*]")
        key = part.removesuffix("[*]")
        nxt: list[tuple[str, Any]] = []
        for where, value in out:
            child = value.get(key, ABSENT) if isinstance(value, dict) else ABSENT
            if star:
                nxt.extend(
                    (f"{where}.{key}[{n}]", item)
                    for n, item in enumerate(child if isinstance(child, list) else [])
                )
            else:
                nxt.append((f"{where}.{key}".lstrip("."), child))
        out = nxt
    return out


def _passes(value: Any, predicates: list[Allowed], whole_list: bool) -> bool:
    if isinstance(value, list) and not whole_list:
        return all(any(p(item) for p in predicates) for item in value)
    return any(p(value) for p in predicates)


def violations(pod: dict[str, Any], rules: list[Rule]) -> list[str]:
    """Every way `pod` (a Pod manifest as JSON) breaks `rules`; empty when it fits them."""
    found = []
    for rule in rules:
        if rule.one_of:
            for where, volume in _values(pod, rule.fields[0]):
                if not any(volume.get(k) is not None for k in rule.one_of):
                    found.append(f"{rule.control}: {where} is none of {rule.one_of}")
            continue
        predicates = [p for p in map(_predicate, rule.allowed) if p is not None]
        whole = any(a.lower().startswith("any list") for a in rule.allowed)
        checked = {f: _values(pod, f) for f in rule.fields}
        pod_level = [f for f in rule.fields if f.startswith("spec.securityContext.")]
        pod_ok = any(
            v is not ABSENT and _passes(v, predicates, whole)
            for f in pod_level
            for _, v in checked[f]
        )
        containers = [v for f in rule.fields if f not in pod_level for _, v in checked[f]]
        containers_ok = bool(containers) and all(
            v is not ABSENT and _passes(v, predicates, whole) for v in containers
        )
        for path, values in checked.items():
            for where, value in values:
                if _passes(value, predicates, whole):
                    continue
                if value is ABSENT and "container fields may be undefined" in rule.note.lower():
                    if path not in pod_level and pod_ok:
                        continue
                    reverse = "pod-level field may be undefined" in rule.note
                    if path in pod_level and reverse and containers_ok:
                        continue
                shown = "absent" if value is ABSENT else repr(value)
                found.append(f"{rule.control}: {where or path} is {shown}")
    return found
