"""A package's names imported from their modules when first used (PEP 562).

``queue_core`` and ``queue_core.lab.speed`` load no module until one of its
names is asked for, so importing the package (or starting a process with
``python -m`` on one of its modules) costs only what is used:

    __getattr__, __dir__ = exports(__name__, {"Queue": "queue"})
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Collection, Mapping


def exports(package: str, home: Mapping[str, str], modules: Collection[str] = ()
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: each name
    of ``home`` comes from the module it maps to (and is kept once imported),
    each of ``modules`` is that submodule."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f".{name}", package)
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home[name]}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home})

    return __getattr__, __dir__
