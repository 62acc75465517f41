"""Handlers ask services: a route module uses what the app keeps (the services under
controlplane/keys.py's app keys) only through their methods and properties, never through the
parts a service was built from (its store, driver, catalog, forwarder, …) nor its private names
(docs/architecture.md, "Handlers ask services").

The route modules are those the layer contract's `protected` list names (pyproject.toml). A
service is reached through `request.app[keys.X]` or `.get(keys.X)`, a name bound to one, a
helper whose return annotation is a service, or a parameter annotated with a service class; on
one, `.name` must be a method or property of its class (what `inspect.getattr_static` finds as
such): an instance attribute or a class constant is a part, and a part is what a handler may not
touch. Read statically with `ast` and resolved against the imported modules, so an alias
(`store = service.store`) or a helper that takes the service is seen as well as a chain.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]

LEFT_FOR_OTHER_BRANCHES: dict[str, set[str]] = {
    # Rewritten with OpenID Connect sign-in (branch identity).
    "controlplane.auth.web": {"SessionService.ttl"},
    # Rewritten with the gateway's outbound policy (branch sec-gateway): streaming through the
    # forwarder, the users' gateway keys, usage.
    "controlplane.gateway.routes": {
        "GatewayService.forwarder",
        "GatewayService.max_body_bytes",
        "GatewayService.meter",
        "GatewayService.monthly_budget",
        "GatewayService.prices",
        "GatewayService.user_keys",
    },
    # The address lookup moves into the driver (branch drivers-pkg); the proxy's own state
    # (client, sockets, touch times) goes with it.
    "controlplane.proxy.routes": {
        "SandboxService.catalog",
        "SandboxService.config",
        "SandboxService.driver",
        "ProxyState.http",
        "ProxyState.sockets",
        "ProxyState.touched",
    },
}
"""Reaches left where another change is rewriting the module (merged separately); each entry
must still be found, so that it is removed here once the module is clean."""


def route_modules() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    protected = [
        c
        for c in contracts
        if c["type"] == "protected" and "controlplane.app" in c.get("allowed_importers", [])
    ]
    assert len(protected) == 1, "one contract lists the route modules"
    modules: list[str] = protected[0]["protected_modules"]
    return modules


@functools.cache
def service_classes() -> dict[str, type]:
    """App key name → the class of what it holds, for the app's own services (not its
    configuration, a pydantic model, nor third-party objects such as the Redis client)."""
    source = (REPO / "controlplane" / "keys.py").read_text()
    tree = ast.parse(source)
    origin: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                origin[alias.asname or alias.name] = node.module
    found: dict[str, type] = {}
    for node in tree.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = node.annotation
        if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.slice, ast.Name)):
            continue
        name = annotation.slice.id
        module = origin.get(name, "")
        if not module.startswith(("controlplane.", "drivers.")):
            continue
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and not issubclass(cls, BaseModel):
            found[node.target.id] = cls
    return found


def _service_in(hint: Any) -> type | None:
    """The service class a type hint names (`X`, `X | None`), if any."""
    services = set(service_classes().values())
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if typing.get_origin(hint) is typing.Union:
        candidates = typing.get_args(hint)
    for candidate in candidates:
        if isinstance(candidate, type) and services & set(candidate.__mro__):
            return candidate
    return None


class _Reaches:
    """Every reach into a service's parts in one module's source (`namespace`: the module's
    globals, where names and annotations resolve)."""

    def __init__(self, source: str, namespace: dict[str, Any]) -> None:
        self.tree = ast.parse(source)
        self.namespace = namespace

    def _annotation(self, node: ast.expr | None) -> type | None:
        if node is None:
            return None
        text = ast.unparse(node)
        try:
            hint = eval(text, self.namespace)  # noqa: S307 - our own source's annotation
        except NameError:
            named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for cls in service_classes().values():
                assert cls.__name__ not in named, f"cannot resolve the annotation {text!r}"
            return None
        return _service_in(hint)

    def _app_key(self, node: ast.expr) -> type | None:
        """`…[keys.X]` or `….get(keys.X)`: the class kept under X."""
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            key = node.args[0]
        if (
            isinstance(key, ast.Attribute)
            and isinstance(key.value, ast.Name)
            and key.value.id == "keys"
        ):
            return service_classes().get(key.attr)
        return None

    def _service_of(self, node: ast.expr, scope: dict[str, type]) -> type | None:
        if isinstance(node, ast.Name):
            return scope.get(node.id)
        if isinstance(node, ast.NamedExpr):
            return self._service_of(node.value, scope)
        found = self._app_key(node)
        if found is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            helper = self.namespace.get(node.func.id)
            if inspect.isfunction(helper):
                found = _service_in(typing.get_type_hints(helper).get("return"))
        return found

    def _scope(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, type]:
        scope: dict[str, type] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args
                for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                    cls = self._annotation(arg.annotation)
                    if cls is not None:
                        scope[arg.arg] = cls
        for _ in range(2):  # a name bound from another bound name
            for node in ast.walk(function):
                target: ast.expr | None = None
                value: ast.expr | None = None
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                    target, value = node.target, node.value
                if isinstance(target, ast.Name) and value is not None:
                    cls = self._service_of(value, scope)
                    if cls is None and isinstance(node, ast.AnnAssign):
                        cls = self._annotation(node.annotation)
                    if cls is not None:
                        scope[target.id] = cls
        return scope

    def __iter__(self) -> Iterator[str]:
        """`Class.part` for each reach, once per place."""
        for function in ast.walk(self.tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if function not in self.tree.body:
                continue  # nested functions are walked with the function around them
            scope = self._scope(function)
            for node in ast.walk(function):
                if not isinstance(node, ast.Attribute):
                    continue
                cls = self._service_of(node.value, scope)
                if cls is not None and not _is_interface(cls, node.attr):
                    yield f"{cls.__name__}.{node.attr}"


def _is_interface(cls: type, name: str) -> bool:
    """A public method or property of `cls` (or of a base)."""
    if name.startswith("_"):
        return False
    found = inspect.getattr_static(cls, name, None)
    kinds = (types.FunctionType, staticmethod, classmethod, property, functools.cached_property)
    return isinstance(found, kinds)


def reaches_of(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    source = Path(inspect.getfile(module)).read_text()
    return list(_Reaches(source, vars(module)))


def test_route_modules_ask_services_and_reach_into_no_part() -> None:
    found = {name: reaches_of(name) for name in route_modules()}
    unexpected = {
        name: sorted(set(reaches) - LEFT_FOR_OTHER_BRANCHES.get(name, set()))
        for name, reaches in found.items()
    }
    assert {n: r for n, r in unexpected.items() if r} == {}, (
        "a route module reaches into a service's parts: give the service a method named for "
        "what the handler wants (docs/architecture.md, 'Handlers ask services')"
    )
    stale = {
        name: sorted(expected - set(found.get(name, [])))
        for name, expected in LEFT_FOR_OTHER_BRANCHES.items()
    }
    assert {n: s for n, s in stale.items() if s} == {}, "remove these from the exemptions"


SAMPLE = """
from aiohttp import web
from controlplane import keys
from controlplane.sandboxes.service import SandboxService

def _service(request: web.Request) -> SandboxService:
    return request.app[keys.SANDBOXES]

async def chain(request: web.Request) -> None:
    await request.app[keys.SANDBOXES].store.get("x")

async def alias(request: web.Request) -> None:
    service = request.app.get(keys.SANDBOXES)
    store = service.catalog
    await service.get(None, "x")  # a method: fine

async def helper(service: SandboxService) -> None:
    service.driver
    service._pause

async def through(request: web.Request) -> None:
    _service(request).launcher
    if (found := request.app.get(keys.POOL)) is not None:
        found.store
"""


def test_the_check_sees_chains_aliases_helpers_and_private_names() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(SAMPLE, "<sample>", "exec"), namespace)  # noqa: S102 - the sample above
    assert sorted(_Reaches(SAMPLE, namespace)) == [
        "SandboxService._pause",
        "SandboxService.catalog",
        "SandboxService.driver",
        "SandboxService.launcher",
        "SandboxService.store",
        "WarmPool.store",
    ]
