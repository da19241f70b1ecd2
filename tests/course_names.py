"""Can the reader call what a notebook's words tell them to call?

A notebook suggests a call when its markdown writes one in code
(`` `plot_sequence(journal, ...)` ``) or a comment or string of its code does.
Such a name must be importable where the notebook says: imported (or
defined) by the notebook itself, a method of an object the notebook holds,
or written in full (``queue_core.lab.plots.plot_sequence``). Names from outside
the package (``os._exit``, SQL's ``count(*)``) are mentions, not suggestions.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import queue_core
from conftest import ROOT
from course_text import BUILTINS, Passage, code_tree, passages

# Where a chapter imports the lab from: each part's __init__ names what it offers.
LAB_PARTS = tuple(f"queue_core.lab.{part}" for part in
                  ("story", "plots", "sweeps", "speed", "broker", "servers", "lifetime",
                   "exercises"))
CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\(")


@dataclass(frozen=True)
class Package:
    """The package's public names: functions and classes by name (with the module that
    exports them), modules by their last name, and every class that has a method."""

    names: dict[str, tuple[str, Any]]
    modules: dict[str, ModuleType]
    classes: tuple[type, ...]

    def method_of(self, name: str, classes: set[type]) -> bool:
        return any(hasattr(cls, name) for cls in classes)


@cache
def package() -> Package:
    modules = [queue_core] + [importlib.import_module(info.name) for info in
                              pkgutil.walk_packages(queue_core.__path__, "queue_core.")
                              if not info.name.endswith("__main__")]  # that one runs the CLI
    names: dict[str, tuple[str, Any]] = {}
    classes: set[type] = set()
    for module in sorted(modules, key=lambda m: (m.__name__.count("."), m.__name__)):
        for name, value in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(value) or inspect.isclass(value)):
                continue
            if getattr(value, "__module__", "").startswith("queue_core"):
                names.setdefault(name, (module.__name__, value))  # the shortest import path
                if inspect.isclass(value):
                    classes.add(value)
    return Package(names, {m.__name__.rsplit(".", 1)[-1]: m for m in modules}, tuple(classes))


@dataclass
class Scope:
    """What a notebook's code binds: every name, the package objects it imports, and
    the variables it makes with a package class (``queue = Queue(...)``)."""

    bound: set[str] = field(default_factory=set)
    objects: dict[str, Any] = field(default_factory=dict)
    types: dict[str, type] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # imports that would fail


def scope_of(path: Path) -> Scope:
    scope = Scope()
    for node in ast.walk(code_tree(path)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _bind_import(scope, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            scope.bound.add(node.id)
        elif isinstance(node, ast.arg):
            scope.bound.add(node.arg)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = _made_by(scope, node.value)
            for target in node.targets:
                if made is not None and isinstance(target, ast.Name):
                    scope.types[target.id] = made
    return scope


def _bind_import(scope: Scope, node: ast.Import | ast.ImportFrom) -> None:
    for alias in node.names:
        if isinstance(node, ast.Import):
            name = alias.asname or alias.name.split(".")[0]
            target = alias.name if alias.asname else name
            scope.bound.add(name)
            if target.startswith("queue_core"):
                scope.objects[name] = importlib.import_module(target)
            continue
        name = alias.asname or alias.name
        scope.bound.add(name)
        if (node.module or "").startswith("queue_core"):
            module = importlib.import_module(node.module or "")
            if hasattr(module, alias.name):
                scope.objects[name] = getattr(module, alias.name)
            elif hasattr(module, "__path__") and \
                    importlib.util.find_spec(f"{node.module}.{alias.name}") is not None:
                scope.objects[name] = importlib.import_module(f"{node.module}.{alias.name}")
            else:
                scope.broken.append(f"`from {node.module} import {alias.name}`: "
                                    f"{node.module} has no {alias.name}")


def _made_by(scope: Scope, call: ast.Call) -> type | None:
    func = call.func
    made = scope.objects.get(func.id) if isinstance(func, ast.Name) else None
    return made if inspect.isclass(made) else None


def suggested_calls(passage: Passage) -> list[str]:
    """The dotted names a passage writes as calls: in markdown only inside code."""
    if passage.kind == "alt":
        return []
    text = passage.text
    if passage.kind == "markdown":
        fenced = re.findall(r"```.*?```", text, flags=re.DOTALL)
        text = "\n".join(fenced + re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text,
                                                                     flags=re.DOTALL)))
    return CALL.findall(text)


def problem(name: str, scope: Scope) -> str | None:
    """Why the reader cannot call ``name`` as this notebook suggests, or ``None``."""
    pkg = package()
    root, *rest = name.split(".")
    if root in scope.bound:
        return _attribute_problem(name, scope)
    if rest:
        if root in pkg.names and inspect.isclass(pkg.names[root][1]):
            return _missing(pkg.names[root][1], rest, name)
        if root in pkg.modules:
            missing = _missing(pkg.modules[root], rest, name)
            if missing or root == "queue_core":
                return missing
            return (f"`{name}(...)`: `{root}` is not imported in this notebook "
                    f"(`from {pkg.modules[root].__name__.rsplit('.', 1)[0]} import {root}`)")
        return None
    if root in BUILTINS or root not in pkg.names:
        return None
    held = set(scope.types.values()) | {v for v in scope.objects.values() if inspect.isclass(v)}
    if pkg.method_of(root, held):
        return None  # a method of an object the notebook has
    return (f"`{root}(...)` is not imported in this notebook "
            f"(`from {_import_path(root)} import {root}`)")


def _import_path(name: str) -> str:
    module = package().names[name][0]
    for public in ("queue_core", *LAB_PARTS):
        if hasattr(importlib.import_module(public), name):
            return public
    return module


def _attribute_problem(name: str, scope: Scope) -> str | None:
    root, *rest = name.split(".")
    if not rest:
        return None
    if root in scope.objects:
        return _missing(scope.objects[root], rest, name)
    if root in scope.types:
        cls = scope.types[root]
        annotated = {n for klass in cls.__mro__ for n in getattr(klass, "__annotations__", {})}
        if hasattr(cls, rest[0]) or rest[0] in annotated:
            return None  # an attribute set on the instance is not followed further
        return f"`{name}(...)`: a {cls.__name__} has no `{rest[0]}`"
    return None


def _missing(obj: Any, rest: list[str], name: str) -> str | None:
    for part in rest:
        if not hasattr(obj, part):
            return f"`{name}(...)`: `{part}` does not exist there"
        obj = getattr(obj, part)
    return None


def notebook_problems(path: Path) -> list[str]:
    """Every suggested call of a notebook the reader could not make as written."""
    scope = scope_of(path)
    found = [f"{path.relative_to(ROOT).as_posix()}: {said}" for said in scope.broken]
    for passage in passages(path):
        for name in suggested_calls(passage):
            said = problem(name, scope)
            if said:
                match = re.search(re.escape(name) + r"\(", passage.text)
                quoted = f' in "{passage.quote(match)}"' if match else ""
                found.append(f"{passage.where}: {said}{quoted}")
    return sorted(set(found))
