"""The public face is exact: one list per public module, one public path to each name.

Public modules are the ones without an underscore in their dotted path; every other module is
an implementation detail. Each public module lists its names in ``__all__``, that list is what a
user can reach, and no name is reachable through two public modules.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "accelplat"

PUBLIC = (
    "accelplat",
    "accelplat.types",
    "accelplat.errors",
    "accelplat.testing",
    "accelplat.integrations.vllm",
    "accelplat.timeline",
    "accelplat.replay",
    "accelplat.pytest_plugin",
)
"""Every public module; all others have an underscore somewhere in their dotted path."""

LAZY = ("accelplat", "accelplat.types", "accelplat.timeline", "accelplat.replay")
"""The public modules that load their names on first use (from an ``_EXPORTS`` table)."""

TOP_LEVEL_BUDGET = 35
PUBLIC_BUDGET = 120


def _dotted(path: Path) -> str:
    parts = ["accelplat", *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split(".")[1:])


_TYPING_NAMES = frozenset({"TYPE_CHECKING", "Any", "annotations"})
"""What ``from __future__ import annotations`` and typing imports leave in a namespace."""


def _reachable(module: types.ModuleType) -> set[str]:
    """Names a user reaches on the module, less submodules and pytest's hooks."""
    names = set(dir(module))
    found = set()
    for name in names:
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType) or name in _TYPING_NAMES:
            continue
        found.add(name)
    return found


def test_every_module_outside_the_public_list_is_private() -> None:
    modules = {_dotted(p) for p in PACKAGE.rglob("*.py")}
    public = {m for m in modules if not _is_private(m)}
    assert public - {"accelplat.integrations"} == set(PUBLIC)


def test_the_pytest_plugin_offers_no_python_names() -> None:
    # Its marker, fixtures and options are reached through pytest, never imported.
    assert importlib.import_module("accelplat.pytest_plugin").__all__ == []


@pytest.mark.parametrize("name", [n for n in PUBLIC if n != "accelplat.pytest_plugin"])
def test_all_is_exactly_what_a_user_reaches(name: str) -> None:
    module = importlib.import_module(name)
    listed = [n for n in module.__all__ if n != "__version__"]
    assert set(listed) == _reachable(module)


def test_no_name_has_two_public_paths() -> None:
    seen: dict[int, str] = {}
    for name in PUBLIC:
        module = importlib.import_module(name)
        for member in module.__all__:
            value = getattr(module, member)
            if isinstance(value, (int, float, str)):
                continue
            where = f"{name}.{member}"
            assert id(value) not in seen, f"{where} is also {seen[id(value)]}"
            seen[id(value)] = where


def test_the_face_and_the_public_names_stay_small() -> None:
    total = sum(len(importlib.import_module(n).__all__) for n in PUBLIC)
    face = importlib.import_module("accelplat").__all__
    assert len(face) <= TOP_LEVEL_BUDGET, face
    assert total <= PUBLIC_BUDGET, total


def _lazy_mirror(path: Path) -> tuple[set[str], set[str]]:
    """The names a lazy module maps at run time and those its ``TYPE_CHECKING`` block imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mapped: set[str] = set()
    typed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_EXPORTS":
            assert isinstance(node.value, ast.Dict)
            mapped = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    typed.update(a.asname or a.name for a in stmt.names)
    return mapped, typed


@pytest.mark.parametrize("name", LAZY)
def test_a_lazy_module_types_exactly_what_it_maps(name: str) -> None:
    module = importlib.import_module(name)
    path = Path(module.__file__ or "")
    mapped, typed = _lazy_mirror(path)
    assert mapped, f"{name} has no _EXPORTS table"
    assert mapped == typed
    assert mapped | ({"__version__"} & set(module.__all__)) == set(module.__all__)


def test_private_modules_keep_no_export_list() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = _dotted(path)
        if not _is_private(dotted):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(getattr(t, "id", "") == "__all__" for t in targets):
                offenders.append(dotted)
    assert offenders == []
