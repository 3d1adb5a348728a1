"""The API reference documents each public name at its public path, and publishes no other."""

from __future__ import annotations

import importlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from tests.contracts.test_exported_members import PUBLIC  # the public modules, checked there

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: (\S+)\n((?:    .*\n)*)", re.MULTILINE)


def _directives() -> list[tuple[str, list[str] | None]]:
    """Every ``::: path`` in docs/api and the members it lists (``None``: all of them)."""
    found = []
    for page in sorted(API.glob("*.md")):
        for path, options in DIRECTIVE.findall(page.read_text(encoding="utf-8") + "\n"):
            members = re.findall(r"^\s+- (\w+)$", options, re.MULTILINE)
            found.append((path, members or None))
    return found


def test_every_directive_names_a_public_path() -> None:
    private = [path for path, _ in _directives() if re.search(r"\._(?!_version__)", path)]
    assert private == []


def test_every_public_name_is_documented_once_at_its_public_path() -> None:
    directives = _directives()
    documented = [path for path, _ in directives if path not in PUBLIC]
    for path, members in directives:
        if path in PUBLIC and members:  # the members a module's directive lists
            documented += [f"{path}.{m}" for m in members]
    for path, members in directives:  # a whole module: what no other directive documents
        if path in PUBLIC and not members:
            names = importlib.import_module(path).__all__
            documented += [f"{path}.{n}" for n in names if f"{path}.{n}" not in documented]
    expected = [f"{m}.{name}" for m in PUBLIC for name in importlib.import_module(m).__all__]
    missing = sorted(set(expected) - set(documented))
    twice = sorted({p for p in documented if documented.count(p) > 1})
    assert (missing, twice) == ([], [])


def test_the_inventory_keeps_public_paths_only(tmp_path: Path) -> None:
    mkdocstrings = pytest.importorskip("mkdocstrings")
    hook: Any = importlib.import_module("docs.api._inventory")
    items = [
        ("accelplat.snapshot", 1),  # documented here
        ("accelplat._memory.snapshot", 2),  # its canonical path: an alias
        ("accelplat.errors.UsageSnapshot", 2),  # imported by errors for a type: an alias
        ("accelplat.__version__", 1),
    ]
    inventory = mkdocstrings.Inventory(
        [
            mkdocstrings.InventoryItem(name, "py", "function", f"api/#{name}", priority)
            for name, priority in items
        ]
    )
    (tmp_path / "objects.inv").write_bytes(inventory.format_sphinx())
    hook.on_post_build({"site_dir": str(tmp_path), "site_name": "accelplat"})
    with (tmp_path / "objects.inv").open("rb") as file:
        kept = mkdocstrings.Inventory.parse_sphinx(io.BufferedReader(file))
    assert sorted(kept) == ["accelplat.__version__", "accelplat.snapshot"]
