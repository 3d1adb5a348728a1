"""Lazy package namespaces (PEP 562): each public name is imported from its module on first use.

Importing ``accelplat`` thus imports no backend, no vendor library, never torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_namespace(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's ``__getattr__`` and ``__dir__``; loaded names stay in ``namespace``."""

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
