"""One definition per fixture name: a test reading `sbx` or `live` finds one fixture of that
name in the suite, not a module's override of another one (a fixture that differs gets a name
that says how). The one exception is the driver contract's: each runtime's
tests/drivers/<runtime>/test_driver_contract.py gives the shared tests of
tests/drivers/contract.py their `driver` (and `test_prefix`, where the runtime needs its own)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CONTRACT_FIXTURES = {"driver", "test_prefix"}


def _fixture_name(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The fixture name `function` defines, None if it is no fixture."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) not in ("pytest.fixture", "fixture", "pytest_asyncio.fixture"):
            continue
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
        return function.name
    return None


def fixture_definitions(root: Path = TESTS) -> dict[str, list[str]]:
    """Every fixture name defined under `root` -> where (path:line), by reading the sources."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if "fixture" not in source:  # most modules define none: no need to parse them
            continue
        module = ast.parse(source, str(path))
        # Fixtures are defined at a module's top level or in a test class.
        nodes = [*module.body]
        nodes += [n for c in module.body if isinstance(c, ast.ClassDef) for n in c.body]
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = _fixture_name(node)
                if name is not None:
                    found[name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def _is_contract_module(place: str) -> bool:
    path = Path(place.rsplit(":", 1)[0])
    return path.name == "test_driver_contract.py" and path.parent.parent == Path("tests/drivers")


def defined_twice(definitions: dict[str, list[str]]) -> dict[str, list[str]]:
    """The names defined in more than one place, the runtimes' contract fixtures aside."""
    twice = {}
    for name, places in definitions.items():
        counted = places
        if name in CONTRACT_FIXTURES:
            counted = [place for place in places if not _is_contract_module(place)]
        if len(counted) > 1:
            twice[name] = counted
    return twice


def test_every_fixture_name_is_defined_once() -> None:
    definitions = fixture_definitions()
    assert {"sbx", "live", "driver"} <= definitions.keys()  # the scan reads the suite at all
    twice = defined_twice(definitions)
    assert twice == {}, f"fixture names defined more than once (give each its own): {twice}"


def test_a_second_definition_is_found_and_only_contracts_may_have_one(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    fixture = "import pytest\n\n@pytest.fixture{}\ndef {}(): ...\n"
    for module, text in {
        "a/test_one.py": fixture.format("", "thing"),
        "b/test_two.py": fixture.format("(name='thing')", "other"),
        "drivers/docker/test_driver_contract.py": fixture.format("", "driver"),
        "drivers/kubernetes/test_driver_contract.py": fixture.format("", "driver"),
        "support/docker_fixtures.py": fixture.format("", "test_prefix"),
        "drivers/kubernetes/conftest.py": fixture.format("", "test_prefix"),
    }.items():
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / module).write_text(text)
    assert defined_twice(fixture_definitions(root)) == {
        "thing": ["tests/a/test_one.py:4", "tests/b/test_two.py:4"],
        # Outside a contract module, the contract's names count like any other.
        "test_prefix": [
            "tests/drivers/kubernetes/conftest.py:4",
            "tests/support/docker_fixtures.py:4",
        ],
    }
