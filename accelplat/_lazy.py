"""Lazy package namespaces (PEP 562): each public name is imported from its module on first use.

``accelplat`` and ``accelplat.timeline`` keep their import cheap this way: importing the package
imports none of the modules behind its names (no backend, no vendor library, never torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_namespace(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's module-level ``__getattr__`` and ``__dir__``.

    Args:
        package: The package's name, for the error message.
        exports: Each public name, mapped to the module that defines it.
        namespace: The package's ``globals()``; a name is cached there once loaded, so the
            next look-up does not reach ``__getattr__`` again.

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level.

    Side effects:
        ``__getattr__`` imports the module behind a name the first time it is asked for.
    """

    def load(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return load, names
